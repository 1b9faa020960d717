"""Object-store checkpoints in the core: when one starts, how its shards and its commit are
decided, and how its events fold into the state (one in flight at a time, committed only when
every shard was reported written, committed steps only move forward).

The cadence is a pure function of the step (`is_due`: every N steps), so trainers and the
supervisor agree on which steps are saved without a round trip: trainers save at those steps
under `checkpoint_id_for(step, generation)`, the core starts the attempt on the first step report
of that step (a rank's step report precedes its shard report on the same stream), counts the
shards, and the shell commits (catalog.commit, off the event loop) and reports the result back.

Off the cadence (an operator's `checkpoint now`, or `auto`: the Young/Daly interval has passed)
the core records CheckpointRequested for a step ahead of every rank (`lead_step`); directives
carry it to the agents, agents hand it to their ranks with the answer to each step report, and
ranks agree on it with one tiny collective per step (trainer.session.checkpoint_due), so a rank
that heard late still saves with the others. A request whose step passes without a start, an
attempt one of whose ranks reported a later step without its shard (`passed_without_shard`), and
an attempt not committed within its timeout, are aborted: nothing waits forever on a missing shard.
Kept apart from evolve.py so the object-store work (issue 6) grows here, not in the dispatcher.
"""

from __future__ import annotations

import math
from itertools import filterfalse, islice

from ftsup.common.checkpoint_ids import checkpoint_id_for, is_due
from ftsup.supervisor.core import frozen, sdc_checks, taint
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.errors import InvalidEvent
from ftsup.supervisor.core.events import (
    CheckpointAborted,
    CheckpointCommitted,
    CheckpointRequested,
    CheckpointShardWritten,
    CheckpointStarted,
    Event,
)
from ftsup.supervisor.core.inputs import CheckpointCommitResult, CheckpointShardReport, StepReport
from ftsup.supervisor.core.limits import MAX_CHECKPOINT_REASON
from ftsup.supervisor.core.policies import interval as interval_policy
from ftsup.supervisor.core.state import (
    ClusterState,
    CommittedCheckpoint,
    PendingCheckpoint,
    RequestedCheckpoint,
    ShardRecord,
    SoftState,
)

CheckpointEvent = (
    CheckpointRequested | CheckpointStarted | CheckpointShardWritten | CheckpointCommitted | CheckpointAborted
)


def evolve_checkpoint(state: ClusterState, event: CheckpointEvent) -> ClusterState:
    pending = state.pending_checkpoint
    match event:
        case CheckpointRequested():
            if state.requested_checkpoint is not None:
                raise InvalidEvent(f"checkpoint {state.requested_checkpoint.checkpoint_id!r} is already requested")
            if state.generation is None or state.generation.number != event.generation:
                raise InvalidEvent(f"checkpoint {event.checkpoint_id!r} requested for generation {event.generation},"
                                   " which is not in force")
            if event.step < 1:
                raise InvalidEvent(f"checkpoint {event.checkpoint_id!r} requested for step {event.step}")
            asked = RequestedCheckpoint(event.checkpoint_id, event.generation, event.step, event.reason)
            return frozen.replace(state, requested_checkpoint=asked)
        case CheckpointStarted():
            if pending is not None:
                raise InvalidEvent(f"checkpoint {pending.checkpoint_id!r} is still in flight")
            if event.shards < 1:
                raise InvalidEvent(f"checkpoint {event.checkpoint_id!r} needs at least one shard")
            fresh = PendingCheckpoint(event.checkpoint_id, event.generation, event.step, event.shards,
                                      location=event.location)
            request = state.requested_checkpoint
            if request is not None and event.step >= request.step:
                request = None  # started (its own step, or a cadence step at or after it)
            return frozen.replace(state, pending_checkpoint=fresh, requested_checkpoint=request,
                                  last_checkpoint_attempt=event.checkpoint_id)
        case CheckpointShardWritten():
            pending = _require_pending(state, event.checkpoint_id)
            if not 0 <= event.shard < pending.shards or event.shard in pending.written:
                raise InvalidEvent(
                    f"shard {event.shard} of checkpoint {event.checkpoint_id!r} is out of range or already written"
                )
            record = ShardRecord(event.shard, event.key, event.sha256, event.size_bytes)
            written = frozen.replace(pending, written=pending.written.append(event.shard),
                                     records=pending.records.append(record))
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
            committed = CommittedCheckpoint(event.checkpoint_id, event.step, event.manifest_key, event.manifest_sha256)
            return frozen.replace(state, checkpoint=committed, pending_checkpoint=None)
        case CheckpointAborted():
            request = state.requested_checkpoint
            is_other = pending is None or pending.checkpoint_id != event.checkpoint_id
            if is_other and request is not None and request.checkpoint_id == event.checkpoint_id:
                return frozen.replace(state, requested_checkpoint=None)  # withdrawn before it started
            _require_pending(state, event.checkpoint_id)
            return frozen.replace(state, pending_checkpoint=None)


def _require_pending(state: ClusterState, checkpoint_id: str) -> PendingCheckpoint:
    pending = state.pending_checkpoint
    if pending is None or pending.checkpoint_id != checkpoint_id:
        raise InvalidEvent(f"checkpoint {checkpoint_id!r} is not in flight")
    return pending



def _is_requested(state: ClusterState, step: int, generation: int) -> bool:
    request = state.requested_checkpoint
    return request is not None and request.generation == generation and request.step == step


def on_step_report(state: ClusterState, report: StepReport, location: str, every_steps: int) -> list[Event]:
    """The first report of a due step starts its checkpoint, unless one is still in flight (that
    step is then skipped: the trainers' shards for it are ignored and gc removes them). A request
    whose step went by without starting (one was in flight then) is withdrawn."""
    generation = state.generation
    if not location or generation is None or generation.number != report.generation:
        return []
    request = state.requested_checkpoint
    if request is not None and request.generation == generation.number and report.step > request.step:
        return [CheckpointAborted(request.checkpoint_id,
                                  f"step {request.step} went by without the requested checkpoint starting"
                                  f" ({_in_flight_text(state)})")]
    if not (is_due(report.step, every_steps) or _is_requested(state, report.step, generation.number)):
        return []
    if state.pending_checkpoint is not None:
        return []
    if state.checkpoint is not None and report.step <= state.checkpoint.step:
        return []
    if taint.is_tainted(state, report.step):
        return []
    checkpoint_id = checkpoint_id_for(report.step, generation.number)
    if checkpoint_id == state.last_checkpoint_attempt:
        return []  # attempted already (and aborted): its shards were consumed by that attempt
    return [CheckpointStarted(checkpoint_id, generation.number, report.step, generation.world_size, location)]


def passed_without_shard(state: ClusterState, generation: int, step: int, rank: int) -> list[Event]:
    """The attempt in flight can never complete once one of its ranks reports a later step
    without having reported its shard: ranks save synchronously between a step's report and the
    next (`trainer.Session.save_checkpoint`), and a shard's report travels behind its step's
    report and ahead of the next on one ordered path (trainer, agent outbox, shard relay). Such a
    rank did not save that step (it heard of a requested step too late, or its shard arrived
    before the attempt started): abort now, not at the timeout (30 min by default) or at the
    generation's end, so that the next due step can start one."""
    pending = state.pending_checkpoint
    if pending is None or pending.generation != generation or step <= pending.step or pending.is_complete \
            or not 0 <= rank < pending.shards or rank in pending.written:
        return []
    return [CheckpointAborted(pending.checkpoint_id,
                              f"rank {rank} reported step {step} without writing its shard of step {pending.step}"
                              f" ({len(pending.written)} of {pending.shards} shards written): it did not save that step")]


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
    if not 0 <= report.rank < pending.shards or report.rank in pending.written:
        return []
    return [CheckpointShardWritten(pending.checkpoint_id, report.rank, report.key, report.sha256, report.size_bytes)]


def on_commit_result(state: ClusterState, result: CheckpointCommitResult) -> list[Event]:
    pending = state.pending_checkpoint
    if pending is None or pending.checkpoint_id != result.checkpoint_id or not pending.is_complete:
        return []  # a stale result (a previous leader's attempt, already decided)
    if result.error:
        return [CheckpointAborted(pending.checkpoint_id, f"commit failed: {result.error}")]
    if taint.is_tainted(state, pending.step):
        return [CheckpointAborted(pending.checkpoint_id, f"step {pending.step} is SDC-tainted")]
    if sdc_checks.is_held(state, pending.step):
        # The shell holds commits back while a check is open (is_commit_held); this result was
        # already under way when the check opened.
        return [CheckpointAborted(pending.checkpoint_id, f"step {pending.step} awaits an SDC recompute check")]
    if state.checkpoint is not None and pending.step <= state.checkpoint.step:
        return [CheckpointAborted(pending.checkpoint_id, f"not newer than step {state.checkpoint.step}")]
    return [CheckpointCommitted(pending.checkpoint_id, pending.step, result.manifest_key, result.manifest_sha256)]


def abandoned(state: ClusterState) -> list[Event]:
    """An incomplete attempt (or a request) of a generation no longer in force can never
    complete: abort it. (A complete one is left to its commit, which needs no trainer.) A
    tainted one never commits."""
    pending = state.pending_checkpoint
    if pending is not None and taint.is_tainted(state, pending.step):
        return [CheckpointAborted(pending.checkpoint_id, f"step {pending.step} is SDC-tainted")]
    generation = state.generation
    number = generation.number if generation is not None else None
    events: list[Event] = []
    request = state.requested_checkpoint
    if request is not None and request.generation != number:
        events.append(CheckpointAborted(request.checkpoint_id,
                                        f"generation {request.generation} ended before step {request.step}"))
    pending = state.pending_checkpoint
    if pending is not None and not pending.is_complete and pending.generation != number:
        events.append(CheckpointAborted(pending.checkpoint_id,
                                        f"generation {pending.generation} ended with {len(pending.written)} of"
                                        f" {pending.shards} shards written"))
    return events


def _in_flight_text(state: ClusterState) -> str:
    pending = state.pending_checkpoint
    if pending is None:
        return "no checkpoint in flight"
    return (f"checkpoint {pending.checkpoint_id} at step {pending.step} is in flight:"
            f" {len(pending.written)} of {pending.shards} shards written")


# -- off the cadence -------------------------------------------------------------------------

def note_clocks(soft: SoftState, state: ClusterState, now: float) -> None:
    """Soft bookkeeping before each decision: when this supervisor first saw the attempt in
    flight and the newest commit (or, before any, when it started deciding)."""
    pending = state.pending_checkpoint
    if pending is None:
        soft.checkpoint_seen = None
    elif soft.checkpoint_seen is None or soft.checkpoint_seen[0] != pending.checkpoint_id:
        soft.checkpoint_seen = (pending.checkpoint_id, now)
    committed = state.checkpoint.checkpoint_id if state.checkpoint is not None else ""
    if soft.checkpoint_clock is None:
        soft.checkpoint_clock = (committed, max(now, soft.started_at_s))
    elif soft.checkpoint_clock[0] != committed:
        soft.checkpoint_clock = (committed, now)


def lead_step(state: ClusterState, soft: SoftState, config: CoreConfig) -> int:
    """The nearest step every rank hears of in time: `lead_steps` and `lead_s` past the newest
    reported step (at the newest step time; lead_steps alone before any is known)."""
    progress = soft.progress
    generation = state.generation
    newest = progress.max_step if progress is not None and generation is not None and \
        progress.generation == generation.number else 0
    timing = config.checkpoint_timing
    lead = timing.lead_steps
    step_time = progress.step_time_s if progress is not None else None
    if step_time is not None and step_time > 0:
        lead = max(lead, math.ceil(timing.lead_s / step_time))
    restored = generation.restore_step or 0 if generation is not None else 0
    return max(newest, restored) + lead


def request_refusal(state: ClusterState, soft: SoftState, config: CoreConfig) -> str | None:
    """Why a checkpoint cannot be requested now, in words an operator can act on; None: it can."""
    if not config.checkpoint_location:
        return ("no checkpoint store is configured on this supervisor (--checkpoint-location): it does not"
                " coordinate object-store checkpoints; nothing was recorded")
    generation = state.generation
    if state.completion is not None:
        return "the job has completed: there is nothing left to checkpoint"
    if generation is None or not generation.is_running:
        return "no generation is running (see `supervisorctl status`); ask again once training runs"
    if state.requested_checkpoint is not None:
        request = state.requested_checkpoint
        return (f"checkpoint {request.checkpoint_id} is already requested at step {request.step}"
                f" ({request.reason}); wait for it (`supervisorctl checkpoints`)")
    if state.pending_checkpoint is not None:
        return f"{_in_flight_text(state)}; wait for it to commit or abort, then ask again"
    if taint.is_tainted(state, lead_step(state, soft, config)):
        return f"steps from {state.sdc_tainted_from_step} are SDC-tainted: no checkpoint can commit until a restore"
    return None


def request(state: ClusterState, soft: SoftState, config: CoreConfig, reason: str) -> list[Event]:
    """CheckpointRequested at the lead step, or nothing when `request_refusal` says why not."""
    if request_refusal(state, soft, config) is not None:
        return []
    assert state.generation is not None  # request_refusal checked
    step = lead_step(state, soft, config)
    checkpoint_id = checkpoint_id_for(step, state.generation.number)
    return [CheckpointRequested(checkpoint_id, state.generation.number, step, reason[:MAX_CHECKPOINT_REASON])]


def on_tick(state: ClusterState, soft: SoftState, now: float, config: CoreConfig) -> list[Event]:
    """The timeout of the attempt in flight, then the Young/Daly cadence (`auto`)."""
    pending = state.pending_checkpoint
    timing = config.checkpoint_timing
    seen = soft.checkpoint_seen
    if pending is not None and seen is not None and seen[0] == pending.checkpoint_id:
        waited = now - max(seen[1], soft.started_at_s)
        if waited >= timing.timeout_s and not pending.is_complete:
            # The first 17 missing ranks, found lazily: `shards` is the record's to state (a forged or
            # corrupt CheckpointStarted may say 2**31), so no set of its size is built (issue 16).
            written = set(pending.written)
            missing = list(islice(filterfalse(written.__contains__, range(pending.shards)), 17))
            shown = ", ".join(map(str, missing[:16])) + (", ..." if len(missing) > 16 else "")
            return [CheckpointAborted(pending.checkpoint_id,
                                      f"timed out after {waited:.0f}s (--checkpoint-timeout-s {timing.timeout_s:g}):"
                                      f" {len(pending.written)} of {pending.shards} shards written; missing ranks {shown}")]
    if not timing.is_auto or soft.checkpoint_clock is None:
        return []
    advice = interval_policy.advise(soft.interval_obs, timing.interval, now)
    since = now - soft.checkpoint_clock[1]
    if since < advice.interval_s:
        return []
    progress = soft.progress
    if progress is None or state.generation is None or progress.generation != state.generation.number \
            or progress.step_reports == 0:
        return []  # the generation has not stepped yet: nothing new to save
    return request(state, soft, config,  # nothing when a request is refused now (one in flight, say)
                   f"auto: {since:.0f}s since the last checkpoint >= the {advice.interval_s:.0f}s interval; {advice.reason}")
