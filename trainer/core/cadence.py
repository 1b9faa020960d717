"""When a rank snapshots: every k steps, k fixed or chosen from the measured step time.

Owns the snapshot cadence, a pure function of (config, state, step, now). A snapshot commits only
when every rank holds its copy of the same step, so the steps must be the same on every rank: the
state holds nothing a rank measures alone except its *proposal*; the shell agrees on the minimum
proposal over the ranks (one small all-reduce at each snapshot step, never in between) and folds
the agreed k back in. Auto mode aims at `interval_s` of training between snapshots: a failure then
loses at most about that much work (k steps), and the snapshot's fixed cost is spread over k
steps. A step slower than the interval gives k = 1: every step, at most one step lost, as a
fixed `every_steps=1`. The first step after a start or a restore is always a snapshot step.
Stdlib only: no clock (the shell passes `now`), no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_INTERVAL_S = 1.0  # about a second of training at risk: less than a restart costs (~2 s here)
MAX_EVERY_STEPS = 10_000  # auto's ceiling, so a run of near-empty steps still snapshots now and then
MAX_INTERVAL_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class CadenceConfig:
    """`every_steps` > 0: a fixed cadence (1 = every step); 0: auto, aiming at `interval_s`."""

    every_steps: int = 0
    interval_s: float = DEFAULT_INTERVAL_S

    def __post_init__(self) -> None:
        if isinstance(self.every_steps, bool) or not 0 <= self.every_steps <= MAX_EVERY_STEPS:
            raise ValueError(f"snapshot every_steps must be within [0, {MAX_EVERY_STEPS}], got {self.every_steps!r}")
        if not (math.isfinite(self.interval_s) and 0 < self.interval_s <= MAX_INTERVAL_S):
            raise ValueError(f"snapshot interval_s must be within (0, {MAX_INTERVAL_S:g}], got {self.interval_s!r}")

    @property
    def is_auto(self) -> bool:
        return self.every_steps == 0


@dataclass(frozen=True, slots=True)
class Cadence:
    """Where a rank is in its cadence: the last snapshot step (None: none since the start) and k."""

    every: int = 1
    last_step: int | None = None
    last_at: float = 0.0  # `now` at the last snapshot step


def start(config: CadenceConfig) -> Cadence:
    return Cadence(every=config.every_steps or 1)


def is_due(cadence: Cadence, step: int) -> bool:
    """Is `step` a snapshot step? The same answer on every rank that folded the same agreements."""
    return cadence.last_step is None or step - cadence.last_step >= cadence.every


def proposal(config: CadenceConfig, cadence: Cadence, step: int, now: float) -> int:
    """The k this rank proposes at snapshot step `step`: the steps that fit into the interval at
    the pace measured since the last snapshot step (1 before any measurement)."""
    if not config.is_auto:
        return config.every_steps
    if cadence.last_step is None or step <= cadence.last_step or now <= cadence.last_at:
        return 1
    per_step_s = (now - cadence.last_at) / (step - cadence.last_step)
    return max(1, min(MAX_EVERY_STEPS, math.ceil(config.interval_s / per_step_s)))


def after_snapshot_step(cadence: Cadence, step: int, now: float, agreed_every: int) -> Cadence:
    """The cadence once `step` was a snapshot step and the ranks agreed on `agreed_every`."""
    if agreed_every < 1:
        raise ValueError(f"agreed snapshot cadence must be >= 1 step, got {agreed_every}")
    return Cadence(every=agreed_every, last_step=step, last_at=now)

