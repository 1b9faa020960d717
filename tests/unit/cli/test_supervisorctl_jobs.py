"""supervisorctl's commands, human and JSON, against an in-process Operator server.

The server is the real one (OperatorService wrapped by operator_guard, grpc.aio on loopback) over
a Runtime on a MemoryLog, driven with real inputs; the clocks are pinned so the goodput figures
can be worked out by hand. supervisorctl runs in a thread (it uses the blocking gRPC API).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
import pytest
import structlog

from ftsup.harness.cluster import free_port
from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.events import NodeRole
from ftsup.supervisor.core.inputs import AgentHello, OperatorRequest, SnapshotReport, StepReport
from ftsup.supervisor.core.policies.straggler import StragglerConfig
from ftsup.supervisor.ctl.main import main
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server.authz import Authorizer
from ftsup.supervisor.server.operator_guard import guarded
from ftsup.supervisor.server.operator_service import OperatorService
from ftsup.v1 import operator_pb2_grpc

SPEC = JobSpec(name="cli", nodes=4, ranks_per_node=1, argv=("train",), code_version="git:abc123",
               data_version="c4@2024-05")
ADMIN = "admin-token-0123456789"
READ = "read-token-0123456789"


class Wall:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cluster:
    address: str
    runtime: Runtime
    wall: Wall

    async def ctl(self, *args: str) -> tuple[int, str, str]:
        """Runs supervisorctl; returns (exit code, stdout, stderr)."""
        return await asyncio.to_thread(run_ctl, "--address", self.address, *args)


_capture: pytest.CaptureFixture[str] | None = None


def run_ctl(*args: str) -> tuple[int, str, str]:
    assert _capture is not None
    _capture.readouterr()
    code = main(list(args))
    out, err = _capture.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _bind_capture(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """supervisorctl's stdout and stderr alone: the in-process server's log lines are held apart."""
    global _capture
    _capture = capsys
    with structlog.testing.capture_logs():
        yield
    _capture = None


async def drive(runtime: Runtime, inp: object) -> None:
    outcome = await runtime.submit(inp)  # type: ignore[arg-type]
    assert outcome.refusal is None, outcome.refusal


async def steps(runtime: Runtime, generation: int, numbers: range, *, slow_rank: int | None = None) -> None:
    current = runtime.state.generation
    assert current is not None
    for step in numbers:
        for member in current.members:
            for rank in member.ranks:
                compute = 0.5 if rank == slow_rank else 0.1 + 0.001 * rank
                await drive(runtime, StepReport(member.node_id, generation, rank, step, 0.6, compute, 2.0, "d"))


async def snapshot(runtime: Runtime, generation: int, step: int) -> None:
    current = runtime.state.generation
    assert current is not None
    for member in current.members:
        for rank in member.ranks:
            for holder in (member.node_id, member.buddy_node_id):
                await drive(runtime, SnapshotReport(holder, generation, rank, step, (holder,), 100))


async def serve(authorizer: Authorizer) -> AsyncIterator[Cluster]:
    config = CoreConfig(job=SPEC, detector=DetectorConfig(heartbeat_interval_s=60.0),
                        straggler=StragglerConfig(window_steps=4, flag_min_over=3, clear_max_over=1))
    wall = Wall()
    runtime = Runtime(config, MemoryLog(), clock=lambda: 100.0, wall_clock=wall, tick_s=0.05)
    loop_task = asyncio.create_task(runtime.run())
    server = grpc.aio.server()
    service = OperatorService(runtime, "127.0.0.1:0")
    service.wall_clock = wall  # type: ignore[method-assign]
    operator_pb2_grpc.add_OperatorServicer_to_server(guarded(service, authorizer), server)
    port = server.add_insecure_port("127.0.0.1:0")  # bound and held: no other process can take it
    await server.start()
    try:
        yield Cluster(f"127.0.0.1:{port}", runtime, wall)
    finally:
        await server.stop(None)
        loop_task.cancel()


@pytest.fixture
async def idle() -> AsyncIterator[Cluster]:
    """A supervisor that has seen no node."""
    async for cluster in serve(Authorizer(None, is_local_only=True)):
        yield cluster


@pytest.fixture
async def history() -> AsyncIterator[Cluster]:
    """Generation 1 runs steps 1..6 (t=1010..1080), rank 3 is a straggler, step 4 commits at
    t=1060; an operator restarts at t=1080, so generation 2 restores step 4 and is starting.
    Goodput at t=1100: restart 10 + 20 s, productive 50 s (1010..1060), lost 20 s (2 steps)."""
    async for cluster in serve(Authorizer(ADMIN, is_local_only=True, read_token=READ)):
        runtime, wall = cluster.runtime, cluster.wall
        for i in range(4):
            await drive(runtime, AgentHello(f"n{i + 1}", 1, NodeRole.ACTIVE, "127.0.0.1", 9000 + i, 8,
                                            runtime.open_stream(StreamOutbox())))
        wall.now = 1010.0
        await steps(runtime, 1, range(1, 5), slow_rank=3)
        wall.now = 1060.0
        await snapshot(runtime, 1, 4)
        wall.now = 1080.0
        await steps(runtime, 1, range(5, 7))
        await drive(runtime, OperatorRequest("restart", "", "loss spike", "alice"))
        wall.now = 1100.0
        yield cluster


async def test_status_shows_generation_leader_checkpoint_and_goodput(history: Cluster) -> None:
    code, out, _ = await history.ctl("status", "--token-file", token_file(READ))
    assert code == 0
    assert "generation  2" in out and "world 4" in out
    assert "last committed step 4   checkpoint none" in out
    assert "ETTR 50.0%" in out and "leader      127.0.0.1:0" in out
    code, out, _ = await history.ctl("status", "--json", "--token-file", token_file(READ))
    status = json.loads(out)
    assert status["ettr"] == 0.5 and status["last_checkpoint_step"] is None and status["generation"] == 2


async def test_nodes_show_xid_counts_and_straggler_scores(history: Cluster) -> None:
    code, out, _ = await history.ctl("nodes", "--token-file", token_file(READ))
    assert code == 0 and "XIDS" in out and "STRAGGLER" in out
    code, out, _ = await history.ctl("nodes", "--json", "--token-file", token_file(READ))
    nodes = {n["node_id"]: n for n in json.loads(out)["nodes"]}
    assert nodes["n4"]["straggler_score"] > 3.0 and nodes["n1"]["straggler_score"] == 0.0
    assert nodes["n1"]["xid_count"] == 0


async def test_goodput_accounts_every_second_in_text_json_and_prometheus(history: Cluster) -> None:
    code, out, _ = await history.ctl("goodput", "--json", "--token-file", token_file(READ))
    assert code == 0
    report = json.loads(out)
    assert report["ettr"] == 0.5 and report["wall_s"] == 100.0
    assert report["buckets_s"] == {"productive": 50.0, "detection": 0.0, "restart": 30.0, "lost_work": 20.0,
                                   "waiting": 0.0}
    assert report["checkpoint_pause_s"] is None and report["lost_steps"] == 2
    assert report["interruptions_by_reason"] == {"operator_restart": 1} and report["generations"] == 2
    code, out, _ = await history.ctl("goodput", "--token-file", token_file(READ))
    assert code == 0 and "ETTR 50.0% over 100.0s" in out
    rows = {line[:12].strip(): line[12:].split()[:2] for line in out.splitlines()[2:8]}
    assert rows == {"productive": ["50.0", "50.0%"], "detection": ["0.0", "0.0%"], "restart": ["30.0", "30.0%"],
                    "lost work": ["20.0", "20.0%"], "waiting": ["0.0", "0.0%"], "checkpoint": ["not", "measured"]}
    assert "interruptions 1 (operator_restart 1)   steps redone 2" in out
    code, out, _ = await history.ctl("goodput", "--prometheus", "--token-file", token_file(READ))
    assert 'ftsup_goodput_ettr{job="cli"} 0.500000' in out
    assert 'ftsup_goodput_seconds{job="cli",bucket="lost_work"} 20.000' in out
    assert 'ftsup_goodput_interruptions{job="cli",reason="operator_restart"} 1' in out


async def test_stragglers_show_scores_policy_and_detections(history: Cluster) -> None:
    code, out, _ = await history.ctl("stragglers", "--json", "--token-file", token_file(READ))
    assert code == 0
    view = json.loads(out)
    assert view["policy"] == {"flag_z": 3.0, "flag_min_over": 3, "window_steps": 4}
    assert view["generation"] == 2 and view["ranks"] == []  # generation 2 has scored no step yet
    [detection] = view["detections"]
    assert detection["kind"] == "straggler_detected" and detection["node_id"] == "n4" and detection["rank"] == 3
    code, out, _ = await history.ctl("stragglers", "--token-file", token_file(READ))
    assert "no step scored yet in this generation" in out and "n4" in out and "3 of its last 4" in out


async def test_stragglers_of_a_running_generation_list_each_ranks_window(history: Cluster) -> None:
    await steps(history.runtime, 2, range(5, 7), slow_rank=3)
    code, out, _ = await history.ctl("stragglers", "--json", "--token-file", token_file(READ))
    ranks = {r["rank"]: r for r in json.loads(out)["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3] and ranks[3]["over_threshold"] == 2 and ranks[3]["node_id"] == "n4"
    code, out, _ = await history.ctl("stragglers", "--token-file", token_file(READ))
    assert "RANK  NODE" in out and "2/2" in out


async def test_checkpoints_list_the_snapshot_and_say_no_store_is_configured(history: Cluster) -> None:
    code, out, _ = await history.ctl("checkpoints", "--json", "--token-file", token_file(READ))
    assert code == 0
    view = json.loads(out)
    assert view["snapshot"] == {"step": 4, "generation": 1, "committed_unix_s": 1060.0}
    assert view["checkpoint"] is None and view["pending"] is None
    assert view["interval"]["seconds"] is None and "no checkpoint store configured" in view["interval"]["reason"]
    assert view["requested"] is None and "no checkpoint store configured" in view["cadence"]
    code, out, _ = await history.ctl("checkpoints", "--token-file", token_file(READ))
    assert "RAM snapshot   step 4 (generation 1) at 1970-01-01 00:17:40 UTC" in out
    assert "checkpoint     none committed" in out and "interval       no checkpoint store configured" in out
    assert "requested      none" in out


async def test_events_at_step_names_the_generations_that_ran_it_with_their_record(history: Cluster) -> None:
    code, out, _ = await history.ctl("events", "--at-step", "5", "--json", "--token-file", token_file(READ))
    assert code == 0
    runs = json.loads(out)["generations"]
    assert [(r["generation"], r["kept"], r["discarded_by_generation"]) for r in runs] == [(1, False, 2), (2, True, None)]
    first = runs[0]["started"]
    assert first["code_version"] == "git:abc123" and first["data_version"] == "c4@2024-05"
    assert first["config_hash"] == SPEC.config_hash and runs[0]["last_step"] == 6
    code, out, _ = await history.ctl("events", "--at-step", "3", "--token-file", token_file(READ))
    assert "step 3 ran in 1 generation(s)" in out and "steps 1..6  KEPT" in out
    assert f"config_hash={SPEC.config_hash}" in out and "code_version=git:abc123" in out
    code, out, _ = await history.ctl("events", "--at-step", "99", "--token-file", token_file(READ))
    assert code == 0 and "step 99 ran in 1 generation(s)" in out  # generation 2 is in force: it will
    code, _, err = await history.ctl("events", "--at-step", "3", "--follow", "--token-file", token_file(READ))
    assert code == 2 and "drop --follow" in err


async def test_events_filter_by_node_and_kind_and_show_the_experiment_record(history: Cluster) -> None:
    code, out, _ = await history.ctl("events", "--node", "n4", "--kind", "straggler_detected", "--json",
                                     "--token-file", token_file(READ))
    assert code == 0
    assert [e["kind"] for e in json.loads(out)["events"]] == ["straggler_detected"]
    code, out, _ = await history.ctl("events", "--kind", "generation_started", "--token-file", token_file(READ))
    assert out.count("generation_started") == 2 and "code_version=git:abc123" in out


async def test_restart_ends_the_generation_and_the_next_restores_the_snapshot(history: Cluster) -> None:
    code, out, _ = await history.ctl("restart", "--reason", "try again", "--operator", "bob", "--json",
                                     "--token-file", token_file(ADMIN))
    assert code == 0
    reply = json.loads(out)
    assert reply["command"] == "restart" and reply["seq"] > 0
    assert reply["detail"].startswith("OperatorCommand, GenerationEnded, GenerationStarted; generation 3 restores step 4")
    code, out, _ = await history.ctl("restart", "--reason", "and again", "--token-file", token_file(ADMIN))
    assert code == 0 and out.startswith("restart: OperatorCommand, GenerationEnded, GenerationStarted; generation 4")


async def test_restart_needs_the_admin_role(history: Cluster) -> None:
    code, _, err = await history.ctl("restart", "--reason", "x", "--token-file", token_file(READ))
    assert code == 4 and "needs the admin role" in err
    code, _, err = await history.ctl("checkpoint", "now", "--reason", "x", "--token-file", token_file(READ))
    assert code == 4


async def test_restart_without_a_generation_fails_and_says_why(idle: Cluster) -> None:
    code, out, err = await idle.ctl("restart", "--reason", "x")
    assert code == 1 and out == ""
    assert "no generation is in force" in err and "supervisorctl status" in err


async def test_checkpoint_now_is_refused_honestly_without_a_checkpoint_store(idle: Cluster) -> None:
    code, _, err = await idle.ctl("checkpoint", "now", "--reason", "before upgrade")
    assert code == 1 and "no checkpoint store is configured" in err and "nothing was recorded" in err
    assert idle.runtime.state.applied_seq == 0
    code, _, err = await idle.ctl("checkpoint", "now", "--reason", " ")
    assert code == 2 and "reason is required" in err


async def test_an_idle_supervisor_has_no_goodput_yet(idle: Cluster) -> None:
    code, out, _ = await idle.ctl("goodput")
    assert code == 0 and "no generation has started yet" in out
    code, out, _ = await idle.ctl("goodput", "--json")
    assert json.loads(out)["ettr"] is None
    code, out, _ = await idle.ctl("status")
    assert "ETTR -" in out


async def test_an_unreachable_supervisor_exits_3_and_says_what_to_check() -> None:
    code, _, err = await asyncio.to_thread(run_ctl, "--address", f"127.0.0.1:{free_port()}", "--timeout", "1",
                                           "goodput")
    assert code == 3 and "is it running?" in err and "--address" in err


_tokens: dict[str, str] = {}


@pytest.fixture(autouse=True, scope="module")
def _token_files(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("tokens")
    for name, token in (("admin", ADMIN), ("read", READ)):
        path = folder / name
        path.write_text(token)
        path.chmod(0o600)
        _tokens[token] = str(path)


def token_file(token: str) -> str:
    return _tokens[token]
