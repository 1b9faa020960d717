"""A restarted job reproduces the uninterrupted run bit for bit (real gloo DDP, real gRPC).

A fake agent (TrainerLink servicer holding snapshots in a dict) serves the example trainer on a
Unix socket; ranks are real processes. The uninterrupted run's final digest must equal that of
a run stopped (cleanly, or by a crashed rank) and restarted from the agent's snapshots.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from ftsup.harness import orphan_guard
from ftsup.harness.cluster import free_port
from ftsup.v1 import agent_pb2, peer_pb2, peer_pb2_grpc

pytestmark = pytest.mark.integration

WORLD = 3
STEPS = 8
# A bound on a hang, not a speed check: an 8-step run of 3 ranks takes ~6 s on an idle machine;
# under a fresh-clone suite, two busy loops and a 12,500-node bench (load average 16 on 2 cores)
# its ranks had not printed a line after 60 s (still importing torch), so the bound is 180 s.
RUN_DEADLINE_S = 180.0
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # the agent's limit: snapshots travel in chunks
CHUNK_BYTES = 64 * 1024  # the fake hands restores back in small chunks: many per snapshot


@dataclass
class FakeAgent(peer_pb2_grpc.TrainerLinkServicer):
    """Holds what trainers send; answers GetRestore with the step chosen by the test."""

    restore_step: int | None = None
    address: str = ""
    # (rank, step) -> (header, payload, sha256), put together from the trainer's chunk stream
    snapshots: dict[tuple[int, int], tuple[peer_pb2.SnapshotHeader, bytes, str]] = field(default_factory=dict)
    reports: list[agent_pb2.StepReport] = field(default_factory=list)
    finished: dict[tuple[int, int], agent_pb2.RankFinished] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def GetRestore(self, request, context):
        """The held snapshot as a chunk stream of CHUNK_BYTES slices; no chunk at all: start fresh."""
        with self.lock:
            held = self.snapshots.get((request.rank, self.restore_step or 0))
        if held is None:
            return
        header, payload, sha256 = held
        for start in range(0, len(payload), CHUNK_BYTES):
            end = min(start + CHUNK_BYTES, len(payload))
            yield peer_pb2.SnapshotChunk(header=header if start == 0 else None, data=payload[start:end],
                                         sha256=sha256 if end == len(payload) else "")

    def ReportStep(self, request, context):
        with self.lock:
            self.reports.append(request)
        return peer_pb2.LinkAck()

    def PutSnapshot(self, request_iterator, context):
        chunks = list(request_iterator)
        if not chunks or not chunks[-1].sha256:  # cut short (its rank was killed): nothing to store
            return peer_pb2.LinkAck()
        header, payload, sha256 = chunks[0].header, b"".join(c.data for c in chunks), chunks[-1].sha256
        assert len(payload) == header.size_bytes and hashlib.sha256(payload).hexdigest() == sha256
        with self.lock:
            self.snapshots[(header.rank, header.step)] = (header, payload, sha256)
        return peer_pb2.LinkAck()

    def ReportFinished(self, request, context):
        with self.lock:
            self.finished[(request.generation, request.rank)] = request
        return peer_pb2.LinkAck()

    def latest_complete_step(self, world: int) -> int | None:
        """Highest step every rank holds a snapshot of (what SnapshotCommitted would name)."""
        with self.lock:
            ranks_by_step: dict[int, set[int]] = defaultdict(set)
            for rank, step in self.snapshots:
                ranks_by_step[step].add(rank)
        complete = [s for s, ranks in ranks_by_step.items() if len(ranks) == world]
        return max(complete, default=None)

    def digests(self, generation: int) -> dict[int, set[str]]:
        """Step -> the set of param digests all ranks reported for it in `generation`."""
        with self.lock:
            out: dict[int, set[str]] = defaultdict(set)
            for r in self.reports:
                if r.generation == generation:
                    out[r.step].add(r.param_digest)
        return out


@contextlib.contextmanager
def serve_fake_agent(directory: Path):
    sock = directory / "agent.sock"
    assert len(str(sock)) < 100, f"unix socket path too long: {sock}"
    servicer = FakeAgent()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    peer_pb2_grpc.add_TrainerLinkServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    servicer.address = f"unix:{sock}"
    try:
        yield servicer
    finally:
        server.stop(grace=None)


@pytest.fixture
def agent(tmp_path):
    with serve_fake_agent(tmp_path) as servicer:
        yield servicer


def start_ranks(agent, tmp_path: Path, generation: int, restore_step: int | None, *flags: str,
                extra_env: dict[str, str] | None = None):
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(
            os.environ,
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
            LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            FTSUP_AGENT_ADDRESS=agent.address, FTSUP_GENERATION=str(generation),
            FTSUP_NODE_ID="node-a",
            FTSUP_RESTORE_STEP="" if restore_step is None else str(restore_step),
            TMPDIR=str(tmp_path), GRPC_VERBOSITY="ERROR", **(extra_env or {}),
        )
        log = open(tmp_path / f"gen{generation}-rank{rank}.log", "wb")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "ftsup.trainer.examples.gpt", *flags],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        )
        orphan_guard.watch(procs[-1])  # stopped even if pytest itself is killed
        log.close()
    return procs


def wait_all(procs, tmp_path: Path, generation: int) -> list[int]:
    deadline = time.monotonic() + RUN_DEADLINE_S
    codes = []
    try:
        for proc in procs:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if any(codes):
        logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob(f"gen{generation}-*.log")))
        raise AssertionError(f"generation {generation} exit codes {codes}\n{logs}")
    return codes


def run(agent, tmp_path, generation, restore_step, *flags) -> None:
    agent.restore_step = restore_step
    wait_all(start_ranks(agent, tmp_path, generation, restore_step, *flags), tmp_path, generation)


def final_digest(agent, generation: int) -> str:
    finished = [agent.finished[(generation, r)] for r in range(WORLD)]
    assert [f.step for f in finished] == [STEPS] * WORLD
    digests = {f.param_digest for f in finished}
    assert len(digests) == 1, f"replicas disagree at the end: {digests}"
    return digests.pop()


def assert_replicas_agree(agent, generation: int, steps: range) -> dict[int, str]:
    per_step = agent.digests(generation)
    for step in steps:
        assert len(per_step[step]) == 1, f"gen {generation} step {step}: {per_step[step]}"
    return {step: next(iter(per_step[step])) for step in steps}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Per-step and final digests of an uninterrupted 8-step run."""
    tmp_path = tmp_path_factory.mktemp("straight")
    with serve_fake_agent(tmp_path) as servicer:
        run(servicer, tmp_path, 1, None, "--steps", str(STEPS))
        per_step = assert_replicas_agree(servicer, 1, range(1, STEPS + 1))
        return per_step, final_digest(servicer, 1)


def test_uninterrupted_run_keeps_replicas_identical_every_step(uninterrupted):
    per_step, final = uninterrupted
    assert per_step[STEPS] == final
    assert len(set(per_step.values())) == STEPS  # parameters change every step


def test_run_restarted_after_rank_crash_at_step_4_ends_bit_identical(
    agent, tmp_path, uninterrupted
):
    per_step, final = uninterrupted
    procs = start_ranks(
        agent, tmp_path, 1, None, "--steps", str(STEPS), "--crash-at-step", "4", "--crash-rank", "1"
    )
    try:
        assert procs[1].wait(timeout=RUN_DEADLINE_S) == 17
    finally:
        for proc in procs:  # the survivors block in the next all-gather; the agent would stop them
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    # The crashed rank's last hand-off may have been lost with it: restore from the highest
    # step every rank's snapshot reached, as the supervisor would.
    restore_step = agent.latest_complete_step(WORLD)
    assert restore_step is not None and 1 <= restore_step <= 4

    run(agent, tmp_path, 2, restore_step, "--steps", str(STEPS))

    restored = assert_replicas_agree(agent, 2, range(restore_step + 1, STEPS + 1))
    assert restored == {s: per_step[s] for s in range(restore_step + 1, STEPS + 1)}
    assert final_digest(agent, 2) == final


def test_auto_cadence_snapshots_the_same_steps_on_every_rank_and_restores_bit_identical(
    agent, tmp_path, uninterrupted
):
    """Session.snapshot_due in auto mode (real gloo: the ranks agree on k with an all-reduce at each
    snapshot step): every rank snapshots the same steps, a gradient digest is reported only for a
    step right after a snapshot (the only steps a recompute can replay), and a crash restores from
    the latest step every rank holds, bit-identical to the uninterrupted run."""
    per_step, final = uninterrupted
    # A short interval: at this model's pace (20-200 ms a step) k is 1 to 5, so a snapshot lands before the crash.
    cadence = {"FTSUP_SNAPSHOT_INTERVAL_S": "0.1"}
    procs = start_ranks(agent, tmp_path, 1, None, "--steps", str(STEPS), "--snapshot-every", "auto",
                        "--crash-at-step", "6", "--crash-rank", "1", extra_env=cadence)
    try:
        assert procs[1].wait(timeout=RUN_DEADLINE_S) == 17
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    by_rank: dict[int, set[int]] = defaultdict(set)
    for rank, step in agent.snapshots:
        by_rank[rank].add(step)
    # One cadence for all ranks. The crash step's snapshot may be cut on a survivor too: its upload
    # runs beside the next step's all-reduce, where the survivors wait until this test kills them.
    survivors = [by_rank[r] - {6} for r in (0, 2)]
    assert survivors[0] and survivors[0] == survivors[1], by_rank
    assert by_rank[1] <= survivors[0] | {6}  # the crashed rank's snapshots: the same steps (6 maybe lost)
    with agent.lock:
        graded = {(r.rank, r.step) for r in agent.reports if r.local_grad_digest}
    assert graded and all(step - 1 in by_rank[rank] for rank, step in graded), (graded, by_rank)
    restore_step = agent.latest_complete_step(WORLD)
    assert restore_step is not None and 1 <= restore_step <= 6

    run(agent, tmp_path, 2, restore_step, "--steps", str(STEPS), "--snapshot-every", "auto")

    restored = assert_replicas_agree(agent, 2, range(restore_step + 1, STEPS + 1))
    assert restored == {s: per_step[s] for s in range(restore_step + 1, STEPS + 1)}
    assert final_digest(agent, 2) == final


def test_default_ddp_allreduce_breaks_bit_exact_restart(agent, tmp_path):
    """Negative control: the check above can see the bucket-layout problem it guards against.

    With 3 ranks a ring all-reduce's summation order depends on an element's position in the
    bucket, and DDP lays buckets out differently on a process's first step.
    """
    flags = ("--grad-sync", "allreduce")
    run(agent, tmp_path, 1, None, "--steps", str(STEPS), *flags)
    straight = final_digest(agent, 1)

    run(agent, tmp_path, 2, 4, "--steps", str(STEPS), *flags)

    assert final_digest(agent, 2) != straight
