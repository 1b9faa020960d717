"""Straggler detector: which ranks are persistently slower than their cohort, from per-rank compute times.

Pure: `observe_step(state, step, compute_times_by_rank, config) -> (state, verdicts)` folds one
training step into a small immutable state. It scores *compute* time (time to reach the gradient
sync), never the synchronized step time, which every rank shares and so hides the culprit.

Each step, every rank gets a robust z-score against that step's cohort: (t - median) / (1.4826 *
MAD), the scale floored at `min_rel_spread * median` so a near-silent cohort does not turn a 0.5 %
wobble into a huge score. Because centre and scale are per step, a whole-cohort stall (a data
loader hiccup) moves the median and cancels out. Persistence: a rank is flagged when at least
`flag_min_over` of its last `window_steps` scores reach `flag_z`, so a single GC pause or a short
burst never flags anyone. Hysteresis: a flagged rank is cleared only when at most
`clear_max_over` of its last `window_steps` scores reach the lower `clear_z`. Verdicts are
emitted on change only and carry their evidence (the window's scores and steps).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

# 1.4826 * MAD estimates the standard deviation of normal data (Rousseeuw & Croux 1993).
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True, slots=True)
class StragglerConfig:
    window_steps: int = 16
    flag_min_over: int = 11
    flag_z: float = 3.0
    clear_z: float = 1.5
    clear_max_over: int = 3
    min_ranks: int = 4
    min_rel_spread: float = 0.01

    def __post_init__(self) -> None:
        if self.window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {self.window_steps}")
        if not 1 <= self.flag_min_over <= self.window_steps:
            raise ValueError(f"flag_min_over must be in [1, {self.window_steps}], got {self.flag_min_over}")
        if not 0 <= self.clear_max_over < self.flag_min_over:
            raise ValueError(f"clear_max_over must be in [0, {self.flag_min_over}), got {self.clear_max_over}")
        if self.clear_z > self.flag_z:
            raise ValueError(f"clear_z ({self.clear_z}) must not exceed flag_z ({self.flag_z})")
        if self.min_ranks < 3:
            raise ValueError(f"min_ranks must be >= 3 for a median to mean anything, got {self.min_ranks}")
        if self.min_rel_spread <= 0:
            raise ValueError(f"min_rel_spread must be > 0, got {self.min_rel_spread}")


@dataclass(frozen=True, slots=True)
class RankWindow:
    steps: tuple[int, ...] = ()  # oldest first, at most window_steps
    scores: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class StragglerState:
    """The detector's memory. Never mutated: `observe_step` returns a new one (soft state, not logged)."""

    last_step: int | None = None
    windows: Mapping[int, RankWindow] = field(default_factory=dict)
    flagged: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class StragglerVerdict:
    rank: int
    step: int
    is_straggler: bool  # True: flagged at this step; False: cleared at this step
    reason: str
    scores: tuple[float, ...]  # the rank's robust z-scores over the window, oldest first
    window: tuple[int, int]  # first and last step of the window
    over_threshold: int  # scores at or above flag_z (flagging) or clear_z (clearing)
    compute_time: float  # the rank's compute time at this step
    cohort_median: float  # the cohort's median compute time at this step


def robust_scores(times: Mapping[int, float], min_rel_spread: float) -> tuple[float, dict[int, float]]:
    """Returns (median, rank -> robust z) for one step's compute times."""
    median = statistics.median(times.values())
    mad = statistics.median(abs(t - median) for t in times.values())
    scale = max(MAD_TO_SIGMA * mad, min_rel_spread * abs(median), 1e-12)
    return median, {rank: (t - median) / scale for rank, t in times.items()}


def observe_step(
    state: StragglerState, step: int, compute_times_by_rank: Mapping[int, float], config: StragglerConfig
) -> tuple[StragglerState, list[StragglerVerdict]]:
    """Folds one step's per-rank compute times into the state; returns it with any flag/clear verdicts.

    Steps at or before `state.last_step` are stale and ignored. A step with fewer than
    `config.min_ranks` ranks is unknown: it moves `last_step` but scores nobody.
    """
    if state.last_step is not None and step <= state.last_step:
        return state, []
    if len(compute_times_by_rank) < config.min_ranks:
        return StragglerState(step, state.windows, state.flagged), []
    median, scores = robust_scores(compute_times_by_rank, config.min_rel_spread)
    n = config.window_steps
    windows = dict(state.windows)
    flagged = set(state.flagged)
    verdicts: list[StragglerVerdict] = []
    for rank, z in scores.items():
        old = windows.get(rank)
        if old is None:
            window = RankWindow((step,), (z,))
        else:
            window = RankWindow((old.steps + (step,))[-n:], (old.scores + (z,))[-n:])
        windows[rank] = window
        if rank in flagged:
            over = sum(1 for s in window.scores if s >= config.clear_z)
            if over <= config.clear_max_over:
                flagged.discard(rank)
                reason = (
                    f"cleared: only {over} of the last {len(window.scores)} steps at z >= {config.clear_z:g} "
                    f"(clear at <= {config.clear_max_over})"
                )
                verdicts.append(_verdict(rank, step, False, reason, window, over, compute_times_by_rank, median))
        elif z >= config.flag_z and len(window.scores) >= config.flag_min_over:
            over = sum(1 for s in window.scores if s >= config.flag_z)
            if over >= config.flag_min_over:
                flagged.add(rank)
                slower = (compute_times_by_rank[rank] / median - 1.0) * 100 if median else float("inf")
                reason = (
                    f"straggler: {over} of the last {len(window.scores)} steps at z >= {config.flag_z:g} "
                    f"(needs {config.flag_min_over}); now {slower:+.1f}% vs the cohort median"
                )
                verdicts.append(_verdict(rank, step, True, reason, window, over, compute_times_by_rank, median))
    return StragglerState(step, windows, frozenset(flagged)), verdicts


def _verdict(
    rank: int, step: int, is_straggler: bool, reason: str, window: RankWindow, over: int,
    times: Mapping[int, float], median: float,
) -> StragglerVerdict:
    return StragglerVerdict(
        rank=rank, step=step, is_straggler=is_straggler, reason=reason, scores=window.scores,
        window=(window.steps[0], window.steps[-1]), over_threshold=over, compute_time=times[rank],
        cohort_median=median,
    )
