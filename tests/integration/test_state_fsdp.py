"""State of any shape under real FSDP2 (`fully_shard`, gloo on CPU): RAM snapshots through the
agent link, a lost rank, and object-store checkpoints restored at another world size.

Ranks are real processes (tests/support/fsdp_ranks.py) talking gRPC to an in-test agent that holds
snapshots in a dict (the trainer side is what is tested here; the real agent's storage has its own
tests). The uninterrupted run is the reference: the restored run must hold its parameters,
optimizer and scheduler state bit for bit at the restore step, see the same batches after it
(StatefulDataLoader), and end with the same digests.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys
from concurrent import futures

import grpc
import pytest
import torch

from ftsup.checkpoint import catalog, supervised
from ftsup.checkpoint.manifest import ShardReport
from ftsup.harness import orphan_guard
from ftsup.harness.cluster import free_port, wait_until
from ftsup.harness.s3_server import S3Server
from ftsup.v1 import peer_pb2, peer_pb2_grpc
from tests.integration.test_trainer_restore import MAX_MESSAGE_BYTES, FakeAgent

pytestmark = pytest.mark.integration

STEPS = 6
LOST_AFTER = 3
RUN_DEADLINE_S = 120.0


class Agent(FakeAgent):
    """The fake agent, also collecting checkpoint shard reports (the supervisor commits them)."""

    def ReportCheckpointShard(self, request, context):
        with self.lock:
            self.shards = [*getattr(self, "shards", []), request]
        return peer_pb2.LinkAck()


@contextlib.contextmanager
def serve_fake_agent(directory: pathlib.Path):
    servicer = Agent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                         options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
    peer_pb2_grpc.add_TrainerLinkServicer_to_server(servicer, server)
    servicer.address = f"unix:{directory / 'agent.sock'}"
    server.add_insecure_port(servicer.address)
    server.start()
    try:
        yield servicer
    finally:
        server.stop(grace=None)


def start(agent, out: pathlib.Path, world: int, generation: int, restore_step: int | None, *flags: str,
          env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    port = free_port()
    tmp = out / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world):
        child = dict(os.environ) | (env or {}) | {
            "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": "1",
            "FTSUP_GENERATION": str(generation), "FTSUP_NODE_ID": f"node-{rank}",
            "FTSUP_AGENT_ADDRESS": agent.address, "FTSUP_RESTORE_STEP": "" if restore_step is None else str(restore_step),
            "TMPDIR": str(tmp), "GRPC_VERBOSITY": "ERROR", "OMP_NUM_THREADS": "1",
        }
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.support.fsdp_ranks", "--rank", str(rank), "--world", str(world),
             "--port", str(port), "--out", str(out), "--steps", str(STEPS), *flags],
            env=child, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=pathlib.Path(__file__).parents[2]))
        orphan_guard.watch(procs[-1])  # stopped even if pytest itself is killed
    return procs


def finish(procs: list[subprocess.Popen]) -> None:
    for rank, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=RUN_DEADLINE_S)
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{out.decode()[-3000:]}"


def batches(out: pathlib.Path, generation: int, world: int) -> dict[int, dict[str, list[int]]]:
    return {r: json.loads((out / f"batches-{generation}-{r}.json").read_text()) for r in range(world)}


def assert_same_state(a: pathlib.Path, b: pathlib.Path) -> None:
    left, right = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert left["model"].keys() == right["model"].keys()
    for key in left["model"]:
        assert torch.equal(left["model"][key], right["model"][key]), key
    assert left["optimizer"]["state"].keys() == right["optimizer"]["state"].keys()
    for name, entry in left["optimizer"]["state"].items():
        for k, v in entry.items():
            assert torch.equal(v, right["optimizer"]["state"][name][k]), (name, k)
    assert left["optimizer"]["param_groups"] == right["optimizer"]["param_groups"]
    assert left["scheduler"] == right["scheduler"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pathlib.Path:
    """The uninterrupted FSDP2 run at world 2, dumping its full state at LOST_AFTER."""
    out = tmp_path_factory.mktemp("fsdp-ref")
    with serve_fake_agent(out) as agent:
        finish(start(agent, out, 2, 0, None, "--dump-at", str(LOST_AFTER)))
        digests = agent.digests(0)
    assert len(digests[STEPS]) == 2  # FSDP over every rank: each rank's shard differs
    (out / "digests.json").write_text(json.dumps({s: sorted(d) for s, d in digests.items()}))
    return out


def test_fsdp2_rank_lost_restores_from_ram_bit_identical_and_resumes_the_data(reference, tmp_path) -> None:
    with serve_fake_agent(tmp_path) as agent:
        procs = start(agent, tmp_path, 2, 1, None, "--lose-rank-after", str(LOST_AFTER))
        assert procs[1].wait(timeout=RUN_DEADLINE_S) == 17  # rank 1 lost after its snapshot was held
        wait_until(lambda: agent.latest_complete_step(2) == LOST_AFTER, RUN_DEADLINE_S, "step 3 snapshots")
        procs[0].kill()  # blocked on its dead peer; the agent would replace it
        procs[0].wait(timeout=RUN_DEADLINE_S)
        groups = {r.rank: r.replica_group for r in agent.reports if r.generation == 1}
        assert groups == {0: 0, 1: 1}  # FSDP over every rank: nobody is a replica of anybody

        agent.restore_step = LOST_AFTER
        finish(start(agent, tmp_path, 2, 2, LOST_AFTER))
        restored_digests = agent.digests(2)
    # Parameters, optimizer and scheduler state equal the uninterrupted run's at the restore step.
    assert_same_state(reference / f"full-0-{LOST_AFTER}.pt", tmp_path / f"full-2-{LOST_AFTER}.pt")
    # The data position: the restarted ranks see exactly the batches the lost run would have.
    ref, lost, resumed = batches(reference, 0, 2), batches(tmp_path, 1, 2), batches(tmp_path, 2, 2)
    for rank in range(2):
        assert {s: b for s, b in ref[rank].items() if int(s) <= LOST_AFTER} == lost[rank]
        assert {s: b for s, b in ref[rank].items() if int(s) > LOST_AFTER} == resumed[rank]
    # And the rest of the run is the reference's, digest for digest (local shards, per rank).
    expected = json.loads((reference / "digests.json").read_text())
    for step in range(LOST_AFTER + 1, STEPS + 1):
        assert sorted(restored_digests[step]) == expected[str(step)], step


def test_fsdp2_checkpoint_saved_at_world_4_restores_resharded_at_world_2(
    tmp_path: pathlib.Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    location = {"FTSUP_CHECKPOINT_LOCATION": f"s3://{s3_server.bucket}/state-{tmp_path.name}",
                "FTSUP_CHECKPOINT_ENDPOINT": s3_server.endpoint_url, "FTSUP_CHECKPOINT_REGION": "us-east-1"}
    saved = tmp_path / "w4"
    saved.mkdir()
    with serve_fake_agent(saved) as agent:
        finish(start(agent, saved, 4, 5, None, "--checkpoint-at", str(LOST_AFTER), "--dump-at", str(LOST_AFTER),
                     env=location))
        shards = sorted(agent.shards, key=lambda s: s.rank)
    assert [(s.rank, s.error) for s in shards] == [(r, "") for r in range(4)]
    store, layout = supervised.CheckpointEnv.from_mapping(location).open()
    # What the supervisor's checkpointer does once every rank reported its shard.
    catalog.commit(store, layout, shards[0].checkpoint_id, LOST_AFTER,
                   [ShardReport(s.rank, s.key, s.sha256, s.size_bytes) for s in shards],
                   supervised.job_topology(4), supervised.JOB_VERSIONS)

    resumed = tmp_path / "w2"
    resumed.mkdir()
    with serve_fake_agent(resumed) as agent:  # an empty agent: no RAM copy, the ladder's next rung
        agent.restore_step = LOST_AFTER
        finish(start(agent, resumed, 2, 6, LOST_AFTER,
                     env=location | {"FTSUP_RESTORE_CHECKPOINT": shards[0].checkpoint_id}))
    assert_same_state(saved / f"full-5-{LOST_AFTER}.pt", resumed / f"full-6-{LOST_AFTER}.pt")
