"""Object-store checkpoints in the core: when one starts, how its shards and its commit are
decided, and how its events fold into the state (one in flight at a time, committed only when
every shard was reported written, committed steps only move forward).

The cadence is a pure function of the step (`is_due`: every N steps), so trainers and the
supervisor agree on which steps are saved without a round trip: trainers save at those steps
under `checkpoint_id_for(step, generation)`, the core starts the attempt on the first step report
of that step (a rank's step report precedes its shard report on the same stream), counts the
shards, and the shell commits (catalog.commit, off the event loop) and reports the result back.
Kept apart from evolve.py so the object-store work (issue 6) grows here, not in the dispatcher.
"""

from __future__ import annotations


from supervisor.core import frozen, sdc_checks
from supervisor.core.errors import InvalidEvent
from supervisor.core.events import (
    CheckpointAborted, CheckpointCommitted, CheckpointShardWritten, CheckpointStarted, Event,
)
from supervisor.core.inputs import CheckpointCommitResult, CheckpointShardReport, StepReport
from supervisor.core.state import ClusterState, CommittedCheckpoint, PendingCheckpoint, ShardRecord

CheckpointEvent = CheckpointStarted | CheckpointShardWritten | CheckpointCommitted | CheckpointAborted


def evolve_checkpoint(state: ClusterState, event: CheckpointEvent) -> ClusterState:
    pending = state.pending_checkpoint
    match event:
        case CheckpointStarted():
            if pending is not None:
                raise InvalidEvent(f"checkpoint {pending.checkpoint_id!r} is still in flight")
            if event.shards < 1:
                raise InvalidEvent(f"checkpoint {event.checkpoint_id!r} needs at least one shard")
            fresh = PendingCheckpoint(event.checkpoint_id, event.generation, event.step, event.shards,
                                      location=event.location)
            return frozen.replace(state, pending_checkpoint=fresh)
        case CheckpointShardWritten():
            pending = _require_pending(state, event.checkpoint_id)
            if not 0 <= event.shard < pending.shards or event.shard in pending.written:
                raise InvalidEvent(
                    f"shard {event.shard} of checkpoint {event.checkpoint_id!r} is out of range or already written"
                )
            record = ShardRecord(event.shard, event.key, event.sha256, event.size_bytes)
            written = frozen.replace(pending, written=(*pending.written, event.shard),
                                     records=(*pending.records, record))
            return frozen.replace(state, pending_checkpoint=written)
        case CheckpointCommitted():
            pending = _require_pending(state, event.checkpoint_id)
            if len(pending.written) != pending.shards or event.step != pending.step:
                raise InvalidEvent(
                    f"checkpoint {event.checkpoint_id!r} cannot commit: {len(pending.written)} of"
                    f" {pending.shards} shards written, step {event.step} vs {pending.step}"
                )
            if state.checkpoint is not None and event.step <= state.checkpoint.step:
                raise InvalidEvent(f"checkpoint step {event.step} is not newer than {state.checkpoint.step}")
            committed = CommittedCheckpoint(event.checkpoint_id, event.step, event.manifest_key)
            return frozen.replace(state, checkpoint=committed, pending_checkpoint=None)
        case CheckpointAborted():
            _require_pending(state, event.checkpoint_id)
            return frozen.replace(state, pending_checkpoint=None)


def _require_pending(state: ClusterState, checkpoint_id: str) -> PendingCheckpoint:
    pending = state.pending_checkpoint
    if pending is None or pending.checkpoint_id != checkpoint_id:
        raise InvalidEvent(f"checkpoint {checkpoint_id!r} is not in flight")
    return pending


def checkpoint_id_for(step: int, generation: int) -> str:
    """The id trainers and the supervisor both derive for the checkpoint of `step` in `generation`
    (trainer.checkpoint.manifest.checkpoint_id_for with the nonce `g<generation>`): ids sort by
    step, and a step saved again in a later generation gets a fresh id."""
    return f"step-{step:010d}-g{generation}"


def is_due(step: int, every_steps: int) -> bool:
    """Is `step` a checkpoint step? Shared with trainers (FTSUP_CHECKPOINT_EVERY_STEPS)."""
    return every_steps > 0 and step > 0 and step % every_steps == 0


def _is_tainted(state: ClusterState, step: int) -> bool:
    return state.sdc_tainted_from_step is not None and step >= state.sdc_tainted_from_step


def on_step_report(state: ClusterState, report: StepReport, location: str, every_steps: int) -> list[Event]:
    """The first report of a due step starts its checkpoint, unless one is still in flight (that
    step is then skipped: the trainers' shards for it are ignored and gc removes them)."""
    generation = state.generation
    if not location or not is_due(report.step, every_steps) or generation is None:
        return []
    if generation.number != report.generation or state.pending_checkpoint is not None:
        return []
    if state.checkpoint is not None and report.step <= state.checkpoint.step:
        return []
    if _is_tainted(state, report.step):
        return []
    checkpoint_id = checkpoint_id_for(report.step, generation.number)
    return [CheckpointStarted(checkpoint_id, generation.number, report.step, generation.world_size, location)]


def is_commit_held(state: ClusterState) -> bool:
    """The shell must not commit the complete attempt yet: a recompute check of its step or an
    earlier one is open (issue 7: checkpoints only from steps whose digests agreed)."""
    pending = state.pending_checkpoint
    return pending is not None and sdc_checks.is_held(state, pending.step)


def on_shard_report(state: ClusterState, report: CheckpointShardReport) -> list[Event]:
    """A written shard counts once; a failed one aborts the attempt; others' shards are ignored."""
    pending = state.pending_checkpoint
    if pending is None or pending.checkpoint_id != report.checkpoint_id or pending.generation != report.generation:
        return []
    if report.error:
        return [CheckpointAborted(pending.checkpoint_id, f"rank {report.rank} could not write its shard: {report.error}")]
    if report.rank in pending.written or not 0 <= report.rank < pending.shards:
        return []
    return [CheckpointShardWritten(pending.checkpoint_id, report.rank, report.key, report.sha256, report.size_bytes)]


def on_commit_result(state: ClusterState, result: CheckpointCommitResult) -> list[Event]:
    pending = state.pending_checkpoint
    if pending is None or pending.checkpoint_id != result.checkpoint_id or not pending.is_complete:
        return []  # a stale result (a previous leader's attempt, already decided)
    if result.error:
        return [CheckpointAborted(pending.checkpoint_id, f"commit failed: {result.error}")]
    if _is_tainted(state, pending.step):
        return [CheckpointAborted(pending.checkpoint_id, f"step {pending.step} is SDC-tainted")]
    if sdc_checks.is_held(state, pending.step):
        # The shell holds commits back while a check is open (is_commit_held); this result was
        # already under way when the check opened.
        return [CheckpointAborted(pending.checkpoint_id, f"step {pending.step} awaits an SDC recompute check")]
    if state.checkpoint is not None and pending.step <= state.checkpoint.step:
        return [CheckpointAborted(pending.checkpoint_id, f"not newer than step {state.checkpoint.step}")]
    return [CheckpointCommitted(pending.checkpoint_id, pending.step, result.manifest_key)]


def abandoned(state: ClusterState) -> list[Event]:
    """An incomplete attempt of a generation no longer in force can never complete: abort it.
    (A complete one is left to its commit, which needs no trainer.) A tainted one never commits."""
    pending = state.pending_checkpoint
    generation = state.generation
    if pending is not None and _is_tainted(state, pending.step):
        return [CheckpointAborted(pending.checkpoint_id, f"step {pending.step} is SDC-tainted")]
    if pending is None or pending.is_complete:
        return []
    if generation is not None and generation.number == pending.generation:
        return []
    return [CheckpointAborted(pending.checkpoint_id,
                              f"generation {pending.generation} ended with {len(pending.written)} of"
                              f" {pending.shards} shards written")]
