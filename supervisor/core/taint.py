"""Tainted steps: how SDC evidence constrains what the state may commit and restore.

Owns one invariant (issue 7): once replicas disagreed at step S (an `SdcSuspected`), or two
recomputes convicted a rank's step S (an `SdcCheckFinished` with `tainted_from_step`), no snapshot
or checkpoint of a step >= S is committed, and no generation restores one. The taint lifts when a
generation restores from before S (or starts fresh): it recomputes those steps on healthy nodes.
Pure; evolve.py calls these so the rules hold on every replica replaying the log.
"""

from __future__ import annotations

from ftsup.supervisor.core import frozen
from ftsup.supervisor.core.errors import InvalidEvent
from ftsup.supervisor.core.events import GenerationStarted, SdcSuspected
from ftsup.supervisor.core.state import ClusterState


def on_suspected(state: ClusterState, event: SdcSuspected) -> ClusterState:
    return taint_from(state, event.step)


def taint_from(state: ClusterState, step: int) -> ClusterState:
    """Steps from `step` on are tainted; the first divergent step counts."""
    tainted = state.sdc_tainted_from_step
    if tainted is not None and tainted <= step:
        return state
    return frozen.replace(state, sdc_tainted_from_step=step)


def covers(tainted_from_step: int | None, step: int) -> bool:
    """The rule, in its one home: `step` is SDC-tainted when a taint starts at or before it."""
    return tainted_from_step is not None and step >= tainted_from_step


def is_tainted(state: ClusterState, step: int) -> bool:
    return covers(state.sdc_tainted_from_step, step)


def require_untainted(state: ClusterState, step: int, what: str) -> None:
    tainted = state.sdc_tainted_from_step
    if covers(tainted, step):
        raise InvalidEvent(f"{what} at step {step}: steps from {tainted} on are SDC-tainted")


def on_generation_started(state: ClusterState, event: GenerationStarted) -> ClusterState:
    """Called after the generation is folded: a restore from before the taint lifts it."""
    tainted = state.sdc_tainted_from_step
    if tainted is None:
        return state
    if event.restore_step is not None:
        require_untainted(state, event.restore_step, f"generation {event.generation} restores")
    return frozen.replace(state, sdc_tainted_from_step=None)
