"""The launcher driven through the scripted process runner: no real processes, milliseconds."""

from __future__ import annotations

import asyncio
import hashlib
import signal
from pathlib import Path

import pytest
import structlog

from ftsup.agent.config import parse_config
from ftsup.agent.core.directives import Step
from ftsup.agent.fakes import FakePeers, ScriptedProcessRunner
from ftsup.agent.launcher import SPAWN_FAILED_EXIT_CODE, Launcher
from ftsup.agent.restore import RestoreBook, RestoreUnavailable, UnknownRank
from ftsup.agent.snapshots import Blob, SnapshotStore
from ftsup.v1 import agent_pb2, events_pb2

LOG = structlog.get_logger("test")


def blob(rank: int, step: int, payload: bytes = b"state") -> Blob:
    return Blob(1, rank, step, "peer", payload, hashlib.sha256(payload).hexdigest())


class Node:
    def __init__(self, tmp_path: Path, peers: FakePeers | None = None, finished_exit_grace_s: float = 0.05) -> None:
        self.config = parse_config(["--node-id", "n1", "--supervisor", "s:1", "--workdir", str(tmp_path), "--gpus", "0"])
        self.runner = ScriptedProcessRunner()
        self.store = SnapshotStore()
        self.reports: list[agent_pb2.AgentMessage] = []
        self.restores = RestoreBook("n1", self.store, peers or FakePeers({}), LOG)  # type: ignore[arg-type]
        self.launcher = Launcher(
            self.config, self.runner, self.store, self.restores, self.reports.append, {"PATH": "/bin"}, LOG,
            stop_grace_s=0.05, finished_exit_grace_s=finished_exit_grace_s,
        )

    def exits(self) -> list[tuple[int, int, int, bool]]:
        return [
            (m.trainer_exit.generation, m.trainer_exit.rank, m.trainer_exit.exit_code, m.trainer_exit.finished)
            for m in self.reports
            if m.WhichOneof("kind") == "trainer_exit"
        ]


def run(generation: int, ranks=(4, 5), **kw) -> agent_pb2.Directive:
    return agent_pb2.Directive(
        generation=generation, action=agent_pb2.ACTION_RUN, ranks=list(ranks), world_size=8,
        master_addr="10.0.0.1", master_port=29500, argv=["python", "train.py"],
        env=[agent_pb2.EnvVar(name="FOO", value="bar")], **kw,
    )


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_run_directive_starts_one_process_per_rank_with_the_rank_env(tmp_path):
    node = Node(tmp_path)
    decision = await node.launcher.apply(run(3))
    assert decision.step is Step.START
    assert [p.env["RANK"] for p in node.runner.spawned] == ["4", "5"]
    env = node.runner.spawned[1].env
    assert env["LOCAL_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "2" and env["WORLD_SIZE"] == "8"
    assert env["FTSUP_AGENT_ADDRESS"] == f"unix:{tmp_path}/agent.sock"
    assert env["FTSUP_GENERATION"] == "3" and env["FTSUP_RESTORE_STEP"] == "" and env["FOO"] == "bar"
    assert env["PATH"] == "/bin" and env["PYTHONUNBUFFERED"] == "1"
    assert node.runner.spawned[1].log_path == tmp_path / "rank-5.gen-3.log"
    assert node.launcher.running_generation() == 3


async def test_same_run_directive_again_does_not_restart_but_updates_buddy(tmp_path):
    node = Node(tmp_path)
    await node.launcher.apply(run(3))
    decision = await node.launcher.apply(run(3, buddy_node_id="n2", buddy_address="h:2", retain_from_step=9))
    assert decision.step is Step.UPDATE
    assert len(node.runner.spawned) == 2 and not node.runner.spawned[0].signals
    assert node.launcher.run.buddy_address == "h:2" and node.launcher.run.retain_from_step == 9


async def test_new_generation_kills_old_trainers_before_starting_new_ones(tmp_path):
    node = Node(tmp_path)
    await node.launcher.apply(run(3))
    old = list(node.runner.spawned)
    assert (await node.launcher.apply(run(4, ranks=(0,)))).step is Step.RESTART
    assert all(p.signals == [signal.SIGKILL] and p.exit_code == -9 for p in old)
    assert len(node.runner.spawned) == 3 and node.runner.spawned[2].env["FTSUP_GENERATION"] == "4"
    assert sorted(node.exits()) == [(3, 4, -9, False), (3, 5, -9, False)]


async def test_older_generation_directive_is_ignored(tmp_path):
    node = Node(tmp_path)
    await node.launcher.apply(run(5))
    assert (await node.launcher.apply(run(4))).step is Step.IGNORE
    assert len(node.runner.spawned) == 2 and node.runner.alive() == node.runner.spawned


async def test_malformed_run_directive_is_ignored_and_keeps_current_trainers(tmp_path):
    node = Node(tmp_path)
    await node.launcher.apply(run(1))
    decision = await node.launcher.apply(run(2, ranks=(9,)))
    assert decision.step is Step.IGNORE and "world_size" in decision.reason
    assert len(node.runner.alive()) == 2


async def test_trainer_exit_reports_whether_the_rank_finished(tmp_path):
    node = Node(tmp_path)
    await node.launcher.apply(run(2))
    assert node.launcher.mark_finished(2, 4)
    assert not node.launcher.mark_finished(2, 7)
    node.runner.spawned[0].exit(0)
    node.runner.spawned[1].exit(1)
    await settle()
    assert sorted(node.exits()) == [(2, 4, 0, True), (2, 5, 1, False)]
    assert node.launcher.running_generation() == 0
    # The same directive re-sent after the ranks exited must not start them again.
    assert (await node.launcher.apply(run(2))).step is Step.UPDATE
    assert len(node.runner.spawned) == 2


async def test_standby_terms_then_kills_trainers_that_ignore_sigterm(tmp_path):
    node = Node(tmp_path)
    node.runner.dies_on = {signal.SIGKILL}
    await node.launcher.apply(run(2))
    standby = agent_pb2.Directive(generation=2, action=agent_pb2.ACTION_STANDBY, reason="quarantined",
                                 standby_cause=agent_pb2.STANDBY_CAUSE_QUARANTINED)
    assert (await node.launcher.apply(standby)).step is Step.STOP
    assert all(p.signals == [signal.SIGTERM, signal.SIGKILL] for p in node.runner.spawned)
    assert (await node.launcher.apply(standby)).step is Step.NOOP


async def test_spawn_failure_is_reported_as_a_trainer_exit(tmp_path):
    node = Node(tmp_path)
    node.runner.fail_spawn = "no such file"
    await node.launcher.apply(run(1, ranks=(0,)))
    assert node.exits() == [(1, 0, SPAWN_FAILED_EXIT_CODE, False)]


async def test_get_restore_without_restore_step_is_fresh_at_once(tmp_path):
    node = Node(tmp_path)
    await node.launcher.apply(run(1))
    assert await node.restores.get(4, 1) is None
    with pytest.raises(UnknownRank):
        await node.restores.get(0, 1)
    with pytest.raises(UnknownRank):
        await node.restores.get(4, 2)


async def test_local_restore_uses_the_store_and_fails_clearly_when_absent(tmp_path):
    node = Node(tmp_path)
    node.store.put(blob(4, 10))
    local = events_pb2.RESTORE_KIND_LOCAL_SNAPSHOT
    restores = [agent_pb2.RestoreFrom(rank=4, kind=local), agent_pb2.RestoreFrom(rank=5, kind=local)]
    await node.launcher.apply(run(2, restore_step=10, restores=restores))
    assert node.runner.spawned[0].env["FTSUP_RESTORE_STEP"] == "10"
    assert (await node.restores.get(4, 2)).payload == b"state"
    with pytest.raises(RestoreUnavailable, match="rank 5 step 10 is not held by node n1"):
        await node.restores.get(5, 2)


async def test_peer_restore_fetches_and_stores_the_blob(tmp_path):
    peers = FakePeers({("h:9", 4, 10): blob(4, 10, b"peer-bytes")})
    node = Node(tmp_path, peers)
    peer = events_pb2.RESTORE_KIND_PEER_SNAPSHOT
    restores = [
        agent_pb2.RestoreFrom(rank=4, kind=peer, source_node_id="n9", source_address="h:9"),
        agent_pb2.RestoreFrom(rank=5, kind=peer, source_node_id="n9", source_address="h:9"),
    ]
    await node.launcher.apply(run(2, restore_step=10, restores=restores))
    assert (await node.restores.get(4, 2)).payload == b"peer-bytes"
    assert node.store.get(4, 10) is not None
    with pytest.raises(RestoreUnavailable, match="n9"):
        await node.restores.get(5, 2)
    assert peers.expected_nodes == ["n9", "n9"]  # the source's identity is pinned, not just its address


def test_store_keeps_four_newest_steps_above_the_floor_and_counts_bytes():
    store = SnapshotStore()
    for step in range(1, 7):
        store.put(blob(0, step, b"x" * step))
    assert store.keys() == [(0, 3), (0, 4), (0, 5), (0, 6)] and store.bytes_held == 18
    store.set_retain_from_step(5)
    assert store.keys() == [(0, 5), (0, 6)] and store.bytes_held == 11


@pytest.mark.parametrize(
    ("payload", "sha", "match"),
    [(b"", "0" * 64, "empty payload"), (b"x", "zz", "not 64 hex"), (b"x", "0" * 64, "mismatch")],
)
def test_store_rejects_bad_blobs(payload, sha, match):
    from ftsup.agent.snapshots import InvalidSnapshot

    with pytest.raises(InvalidSnapshot, match=match):
        SnapshotStore().put(Blob(1, 0, 1, "n", payload, sha))


async def test_a_rank_that_never_opened_a_session_reports_a_plain_script_exit_with_its_output_tail(tmp_path):
    node = Node(tmp_path)
    await node.launcher.apply(run(3, cwd=str(tmp_path), restart_count=2, max_restarts=3, job_name="j"))
    assert node.runner.cwds == [tmp_path, tmp_path]
    env = node.runner.spawned[0].env
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"], env["TORCHELASTIC_RUN_ID"]) == \
        ("2", "3", "j")
    assert env["TORCHELASTIC_ERROR_FILE"] == str(tmp_path / "rank-4.gen-3.error.json")
    node.launcher.mark_attached(3, 5)  # rank 5 uses a Session
    (tmp_path / "rank-4.gen-3.log").write_text("step 1\nTraceback (most recent call last):\nValueError: boom\n")
    node.runner.spawned[0].exit(1)
    node.runner.spawned[1].exit(0)
    await settle()
    sent = {m.trainer_exit.rank: m.trainer_exit for m in node.reports if m.WhichOneof("kind") == "trainer_exit"}
    assert sent[4].is_plain_script and sent[4].output_tail.endswith("ValueError: boom")
    assert not sent[5].is_plain_script and sent[5].output_tail == ""  # exit 0 carries no tail


async def test_stop_gives_the_jobs_sigterm_grace_before_sigkill(tmp_path):
    node = Node(tmp_path)  # the agent's default grace: 0.05 s
    node.runner.dies_on = {signal.SIGKILL}  # a save-on-SIGTERM handler that takes its time
    await node.launcher.apply(run(3, stop_grace_s=60.0))
    standby = agent_pb2.Directive(generation=3, action=agent_pb2.ACTION_STANDBY, reason="job failed",
                                 standby_cause=agent_pb2.STANDBY_CAUSE_JOB_FAILED)
    stopping = asyncio.create_task(node.launcher.apply(standby))
    await asyncio.sleep(0.2)  # well past the agent's default grace, far within the job's
    assert all(p.signals == [signal.SIGTERM] for p in node.runner.spawned)
    for process in node.runner.spawned:  # the handlers finish their saves and exit
        process.exit(0)
    await asyncio.wait_for(stopping, 10)
    assert all(p.signals == [signal.SIGTERM] for p in node.runner.spawned)


async def test_a_rank_that_finished_exits_by_itself_before_any_signal(tmp_path):
    """After finish() a script may still save its model (HF, Lightning): the job's completion must
    not SIGTERM it mid-save. Unfinished ranks are stopped as before."""
    node = Node(tmp_path, finished_exit_grace_s=30.0)
    node.runner.dies_on = {signal.SIGTERM, signal.SIGKILL}
    await node.launcher.apply(run(2))
    assert node.launcher.mark_finished(2, 4)
    finished, unfinished = node.runner.spawned
    standby = agent_pb2.Directive(generation=2, action=agent_pb2.ACTION_STANDBY, reason="job completed",
                                 standby_cause=agent_pb2.STANDBY_CAUSE_JOB_COMPLETED)
    stopping = asyncio.create_task(node.launcher.apply(standby))
    await asyncio.sleep(0.2)
    assert finished.signals == [] and unfinished.signals == []  # waiting for the finished one
    finished.exit(0)  # its post-training work done
    await asyncio.wait_for(stopping, 10)
    assert finished.signals == [] and unfinished.signals == [signal.SIGTERM]


async def test_a_finished_rank_that_does_not_exit_is_stopped_after_its_grace(tmp_path):
    node = Node(tmp_path, finished_exit_grace_s=0.1)
    await node.launcher.apply(run(2))
    assert node.launcher.mark_finished(2, 4) and node.launcher.mark_finished(2, 5)
    standby = agent_pb2.Directive(generation=2, action=agent_pb2.ACTION_STANDBY, reason="job completed",
                                 standby_cause=agent_pb2.STANDBY_CAUSE_JOB_COMPLETED)
    await asyncio.wait_for(node.launcher.apply(standby), 10)
    assert all(p.signals == [signal.SIGTERM] for p in node.runner.spawned)
