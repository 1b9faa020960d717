"""When a live rank counts as hung: no progress for max(multiple x median step time, floor), or,
inside a named phase (evaluation, a checkpoint save, a data stall), for the phase's own limit.

Pure. A rank that has not finished its first step yet (imports, process-group set-up, restore)
gets the separate, longer `startup_s`. The median over recent steps tolerates occasional slow
steps (checkpoints, evaluation) without lowering the bar for a real hang. Progress is a step
report or a liveness report (`session.heartbeat()`, entering or leaving a phase); only ranks that
use a Session are judged at all (a plain torchrun script never reports, so silence says nothing).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HangConfig:
    multiple: float = 10.0  # x the median step time
    floor_s: float = 120.0  # never less than this
    startup_s: float = 600.0  # before the first step of a generation

    def __post_init__(self) -> None:
        if not (self.multiple >= 1 and self.floor_s > 0 and self.startup_s > 0):
            raise ValueError(f"hang limits must be positive (multiple >= 1), got {self}")


@dataclass(frozen=True, slots=True)
class Phase:
    """A named stretch of work with its own hang limit (`with session.phase("eval", timeout_s=1800)`)."""

    name: str
    timeout_s: float


MAX_PHASE_TIMEOUT_S = 7 * 24 * 3600.0  # a phase limit beyond a week is a mistake, not a plan


@dataclass(frozen=True, slots=True)
class Hang:
    silent_for_s: float
    limit_s: float
    phase: str = ""  # the phase the rank was in, "" when training steps


def hang_limit_s(recent_step_times_s: Sequence[float], config: HangConfig, phase: Phase | None = None) -> float:
    if phase is not None and phase.timeout_s > 0:
        return phase.timeout_s
    if not recent_step_times_s:
        return config.startup_s
    return max(config.floor_s, config.multiple * statistics.median(recent_step_times_s))


def check_hang(
    recent_step_times_s: Sequence[float], last_progress_s: float, now: float, config: HangConfig,
    phase: Phase | None = None,
) -> Hang | None:
    """A Hang when the rank has been silent past its limit, else None."""
    limit = hang_limit_s(recent_step_times_s, config, phase)
    silent = now - last_progress_s
    return Hang(silent, limit, phase.name if phase is not None else "") if silent > limit else None
