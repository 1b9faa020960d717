"""Core decisions for object-store checkpoints: cadence, shard counting, commit/abort, abandonment,
the restore directive. Pure: milliseconds."""

from __future__ import annotations

from ftsup.checkpoint import manifest
from ftsup.common import checkpoint_ids
from ftsup.supervisor.core import checkpoints as cp
from ftsup.supervisor.core.config import JobSpec
from ftsup.supervisor.core.directives import directive_for
from ftsup.supervisor.core.events import (
    CheckpointAborted,
    CheckpointCommitted,
    CheckpointShardWritten,
    CheckpointStarted,
    RankAssignment,
    RankRestore,
    RestoreKind,
)
from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.inputs import CheckpointCommitResult, CheckpointShardReport, StepReport
from ftsup.supervisor.core.state import ClusterState, CommittedCheckpoint, Generation

LOC = "/tmp/ckpt"
MEMBERS = (RankAssignment("n1", (0,), "n2"), RankAssignment("n2", (1,), "n1"))


def _state(number: int = 1, **kw: object) -> ClusterState:
    gen = Generation(number, MEMBERS, 2, "127.0.0.1", 29500, None, 0, (), first_step=1)
    return ClusterState(generation=gen, **kw)  # type: ignore[arg-type]


def _step(step: int, rank: int = 0, generation: int = 1) -> StepReport:
    return StepReport(f"n{rank + 1}", generation, rank, step, 0.1, 0.1, 1.0, "d")


def _shard(rank: int, cid: str = "step-0000000004-g1", error: str = "") -> CheckpointShardReport:
    return CheckpointShardReport(f"n{rank + 1}", 1, rank, cid, 4, f"{cid}/shards/rank-{rank:05d}.json", "a" * 64, 10, error)


def test_trainer_and_core_use_the_one_rule_for_ids_and_cadence():
    assert cp.is_due is checkpoint_ids.is_due and cp.checkpoint_id_for is checkpoint_ids.checkpoint_id_for
    assert [s for s in range(0, 30) if checkpoint_ids.is_due(s, 7)] == [7, 14, 21, 28]
    assert not any(checkpoint_ids.is_due(s, 0) for s in range(30))
    assert checkpoint_ids.checkpoint_id_for(12, 3) == "step-0000000012-g3"
    assert manifest.step_of(checkpoint_ids.checkpoint_id_for(12, 3)) == 12, "the manifest's id form"


def test_a_due_step_starts_one_checkpoint_with_a_shard_per_rank():
    state = _state()
    assert cp.on_step_report(state, _step(3), LOC, 4) == []
    assert cp.on_step_report(state, _step(4), "", 4) == []  # no store: never
    started = cp.on_step_report(state, _step(4), LOC, 4)
    assert started == [CheckpointStarted("step-0000000004-g1", 1, 4, 2, LOC)]
    folded = evolve_all(state, started)
    assert cp.on_step_report(folded, _step(4, rank=1), LOC, 4) == []  # one in flight
    assert cp.on_step_report(folded, _step(8), LOC, 4) == []  # skipped while one is in flight
    newer = _state(checkpoint=CommittedCheckpoint("x", 8, "x/MANIFEST.json"))
    assert cp.on_step_report(newer, _step(8), LOC, 4) == []  # not newer than the committed one
    assert cp.on_step_report(_state(sdc_tainted_from_step=3), _step(4), LOC, 4) == []


def test_shards_then_a_successful_commit_result_commit():
    state = evolve_all(_state(), cp.on_step_report(_state(), _step(4), LOC, 4))
    first = cp.on_shard_report(state, _shard(0))
    assert first == [CheckpointShardWritten("step-0000000004-g1", 0, "step-0000000004-g1/shards/rank-00000.json",
                                            "a" * 64, 10)]
    state = evolve_all(state, first)
    assert cp.on_shard_report(state, _shard(0)) == []  # counted once
    assert cp.on_shard_report(state, _shard(1, cid="step-0000000008-g1")) == []  # not in flight
    assert cp.on_commit_result(state, CheckpointCommitResult("step-0000000004-g1", 4, "m")) == []  # incomplete
    state = evolve_all(state, cp.on_shard_report(state, _shard(1)))
    assert state.pending_checkpoint is not None and state.pending_checkpoint.is_complete
    assert [r.shard for r in state.pending_checkpoint.records] == [0, 1]
    pin = "b" * 64
    committed = cp.on_commit_result(state, CheckpointCommitResult("step-0000000004-g1", 4, "k/MANIFEST.json",
                                                                  manifest_sha256=pin))
    assert committed == [CheckpointCommitted("step-0000000004-g1", 4, "k/MANIFEST.json", pin)]
    state = evolve_all(state, committed)
    assert state.checkpoint == CommittedCheckpoint("step-0000000004-g1", 4, "k/MANIFEST.json", pin)
    assert state.pending_checkpoint is None


def test_a_failed_shard_or_commit_aborts():
    state = evolve_all(_state(), cp.on_step_report(_state(), _step(4), LOC, 4))
    [aborted] = cp.on_shard_report(state, _shard(1, error="OSError: disk full"))
    assert isinstance(aborted, CheckpointAborted) and "rank 1" in aborted.reason and "disk full" in aborted.reason
    for rank in (0, 1):
        state = evolve_all(state, cp.on_shard_report(state, _shard(rank)))
    [aborted] = cp.on_commit_result(state, CheckpointCommitResult("step-0000000004-g1", 4, "", "ObjectCorrupt: x"))
    assert isinstance(aborted, CheckpointAborted) and "ObjectCorrupt" in aborted.reason
    assert evolve_all(state, [aborted]).pending_checkpoint is None


def test_a_rank_that_reports_a_later_step_without_its_shard_aborts_the_attempt():
    """Ranks save between a step's report and the next, and the shard's report travels between
    them: a later step without the shard means that rank did not save (heard of the step too late)."""
    state = evolve_all(_state(), cp.on_step_report(_state(), _step(4), LOC, 4))
    state = evolve_all(state, cp.on_shard_report(state, _shard(0)))
    assert cp.passed_without_shard(state, 1, 5, 0) == []  # rank 0 wrote its shard
    assert cp.passed_without_shard(state, 1, 4, 1) == []  # rank 1 is still at the step: it may save yet
    assert cp.passed_without_shard(state, 2, 5, 1) == []  # another generation's report
    assert cp.passed_without_shard(state, 1, 5, 7) == []  # no rank of this attempt
    [aborted] = cp.passed_without_shard(state, 1, 5, 1)
    assert isinstance(aborted, CheckpointAborted) and aborted.checkpoint_id == "step-0000000004-g1"
    assert "rank 1 reported step 5 without writing its shard of step 4" in aborted.reason
    assert "1 of 2 shards written" in aborted.reason
    assert evolve_all(state, [aborted]).pending_checkpoint is None
    assert cp.passed_without_shard(ClusterState(), 1, 5, 1) == []  # nothing in flight


def test_an_incomplete_attempt_of_an_ended_generation_is_abandoned():
    state = evolve_all(_state(), cp.on_step_report(_state(), _step(4), LOC, 4))
    assert cp.abandoned(state) == []
    ended = ClusterState(pending_checkpoint=state.pending_checkpoint)
    [aborted] = cp.abandoned(ended)
    assert isinstance(aborted, CheckpointAborted) and "0 of 2 shards" in aborted.reason
    for rank in (0, 1):
        state = evolve_all(state, cp.on_shard_report(state, _shard(rank)))
    assert cp.abandoned(ClusterState(pending_checkpoint=state.pending_checkpoint)) == []  # left to its commit


def test_ranks_restoring_from_the_store_are_told_the_committed_checkpoint():
    job = JobSpec("j", 2, 1, ("python",))
    restores = (RankRestore(0, RestoreKind.CHECKPOINT, ""), RankRestore(1, RestoreKind.CHECKPOINT, ""))
    gen = Generation(2, MEMBERS, 2, "127.0.0.1", 29500, 4, 1, restores)
    state = ClusterState(generation=gen, checkpoint=CommittedCheckpoint("step-0000000004-g1", 4, "m", "c" * 64))
    env = {e.name: e.value for e in directive_for(state, job, "n1", "").env}
    assert env["FTSUP_RESTORE_CHECKPOINT"] == "step-0000000004-g1"
    assert env["FTSUP_RESTORE_CHECKPOINT_SHA256"] == "c" * 64  # the pin the trainer verifies the manifest by
    ram = Generation(2, MEMBERS, 2, "127.0.0.1", 29500, 4, 1, (RankRestore(0, RestoreKind.LOCAL_SNAPSHOT, "n1"),))
    state = ClusterState(generation=ram, checkpoint=CommittedCheckpoint("step-0000000004-g1", 4, "m"))
    assert "FTSUP_RESTORE_CHECKPOINT" not in {e.name for e in directive_for(state, job, "n1", "").env}
