"""How checkpoint events fold into the state: one checkpoint in flight at a time, committed only
when every shard was reported written, and committed steps only move forward.

Kept apart from evolve.py so the object-store work (issue 6) grows here, not in the dispatcher.
"""

from __future__ import annotations


from supervisor.core import frozen
from supervisor.core.errors import InvalidEvent
from supervisor.core.events import CheckpointAborted, CheckpointCommitted, CheckpointShardWritten, CheckpointStarted
from supervisor.core.state import ClusterState, CommittedCheckpoint, PendingCheckpoint

CheckpointEvent = CheckpointStarted | CheckpointShardWritten | CheckpointCommitted | CheckpointAborted


def evolve_checkpoint(state: ClusterState, event: CheckpointEvent) -> ClusterState:
    pending = state.pending_checkpoint
    match event:
        case CheckpointStarted():
            if pending is not None:
                raise InvalidEvent(f"checkpoint {pending.checkpoint_id!r} is still in flight")
            if event.shards < 1:
                raise InvalidEvent(f"checkpoint {event.checkpoint_id!r} needs at least one shard")
            fresh = PendingCheckpoint(event.checkpoint_id, event.generation, event.step, event.shards)
            return frozen.replace(state, pending_checkpoint=fresh)
        case CheckpointShardWritten():
            pending = _require_pending(state, event.checkpoint_id)
            if not 0 <= event.shard < pending.shards or event.shard in pending.written:
                raise InvalidEvent(
                    f"shard {event.shard} of checkpoint {event.checkpoint_id!r} is out of range or already written"
                )
            written = frozen.replace(pending, written=(*pending.written, event.shard))
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
