"""RAM snapshot commits in the core: when a step's snapshots become the restore point.

A step commits once every rank is held twice (owner and buddy), the holders of each rank reported
the same payload SHA-256 (issue 16), its digests agreed (issue 7: a snapshot of a step whose
replicas disagreed is never committed, so never restored), no open SDC recompute check holds it
back and no verdict tainted it. A commit is also the moment a drained node's ranks are handed
over (drains.py). The holdings themselves are soft state (soft.py); this module only decides.
Pure.
"""

from __future__ import annotations

from ftsup.supervisor.core import drains, sdc_checks, taint
from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core.events import Event, SnapshotCommitted
from ftsup.supervisor.core.state import ClusterState, SoftState


def commit_if_held(state: ClusterState, soft: SoftState, step: int) -> list[Event]:
    """Commits `step` of the generation in force when it may be restored (see the module's rules),
    with a pending drain's hand-over after it."""
    generation = state.generation
    progress = soft.progress
    if generation is None or progress is None or progress.generation != generation.number:
        return []
    if state.snapshot is not None and step <= state.snapshot.step:
        return []
    held = progress.holdings.get(step)
    if held is None or soft_state.lacks_pairs(held, generation.index):
        return []  # (asked first: the answer to most of a step's holdings, one count away)
    if not soft_state.is_committable(progress, step):
        return []
    if sdc_checks.is_held(state, step) or taint.is_tainted(state, step):
        return []  # an open recompute check may still prove it corrupt, or one did
    if step in progress.holding_mismatches:
        return []  # owner and buddy reported different bytes for a rank: never a restore source
    if not soft_state.is_held_twice(held, generation.index):
        return []
    return [SnapshotCommitted(generation=generation.number, step=step), *drains.hand_over_at(soft, generation, step)]


def commit_newest_held(state: ClusterState, soft: SoftState) -> list[Event]:
    """The newest reported step that may commit now (SDC checks closed: what they held back)."""
    progress = soft.progress
    generation = state.generation
    if generation is None or progress is None or progress.generation != generation.number:
        return []
    for step in sorted(progress.holdings, reverse=True):
        committed = commit_if_held(state, soft, step)
        if committed:
            return committed
    return []
