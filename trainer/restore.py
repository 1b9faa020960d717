"""The first rung of the recovery ladder on the trainer side: the rank's snapshot back from its agent.

Owns the checks a RAM restore must pass before a byte reaches the live state: the agent holds a
copy when FTSUP_RESTORE_STEP says one exists (else the object-store checkpoint the supervisor named
is the rung), the copy is this rank's (an elastic job's ranks hold the same state, so another
rank's copy is fine there) at the expected step, its SHA-256 matched while it streamed in, and the
payload itself says the same step.
"""

from __future__ import annotations

from typing import Any, Protocol

from ftsup.common.chunks import InvalidSnapshot
from ftsup.trainer import snapshot as snap
from ftsup.trainer.agent_client import HeldSnapshot
from ftsup.trainer.snapshot import RestoredState, SnapshotCorrupt


class RestoreSource(Protocol):
    address: str

    def get_restore(self, rank: int, generation: int) -> HeldSnapshot | None: ...


def fetch(source: RestoreSource, rank: int, generation: int) -> HeldSnapshot | None:
    """The agent's copy of this rank's snapshot (None: it holds none); a malformed stream is corrupt."""
    try:
        return source.get_restore(rank, generation)
    except InvalidSnapshot as exc:
        raise SnapshotCorrupt(f"restore from agent at {source.address!r}: {exc}") from exc


def apply_held(held: HeldSnapshot | None, address: str, rank: int, expected: int, any_rank: bool,
               objects: dict[str, Any]) -> RestoredState:
    """Loads `held` (the agent's answer) into `objects` after checking it is the snapshot asked for."""
    if held is None:
        raise RuntimeError(f"agent at {address!r} has no snapshot for rank {rank} although FTSUP_RESTORE_STEP={expected}")
    if (held.rank != rank and not any_rank) or held.step != expected:
        raise RuntimeError(
            f"agent at {address!r} returned the snapshot of rank {held.rank} "
            f"step {held.step}, expected rank {rank} step {expected}"
        )
    state = snap.load(held.payload)  # its SHA-256 was checked while it streamed in
    restored = snap.apply_objects(state, objects)
    if restored.step != expected:
        raise SnapshotCorrupt(f"snapshot payload holds step {restored.step}, its blob says step {expected}")
    return restored
