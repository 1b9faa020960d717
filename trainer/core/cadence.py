"""When a rank snapshots: every k steps, k fixed or chosen from the measured step time.

Owns the snapshot cadence, a pure function of (config, state, step, now). A snapshot commits only
when every rank holds its copy of the same step, so the steps must be the same on every rank: the
state holds nothing a rank measures alone except its *proposal*; the shell agrees on the minimum
proposal over the ranks (one small all-reduce at each snapshot step, never in between) and folds
the agreed k back in. Auto mode aims at `interval_s` of training between snapshots: a failure then
loses at most about that much work (k steps), and the snapshot's fixed cost is spread over k
steps. A step slower than the interval gives k = 1: every step, at most one step lost, as a
fixed `every_steps=1`. The step a rank starts from is held already (restored, or the initial
state), so auto measures the pace first instead of snapshotting the slow steps of a restart.
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
    """Where a rank is in its cadence: the last step held (a snapshot's, or the one the rank started
    from: restored, or 0 at a fresh start), k, and where the pace is measured from."""

    every: int
    last_step: int
    mark_step: int | None = None  # None: the pace has no origin yet (the first call sets it)
    mark_at: float = 0.0  # `now` at mark_step


def start(config: CadenceConfig, from_step: int) -> Cadence:
    """At a start or a restore from `from_step`: that step is held already (restored, or step 0 is
    the initial state), so nothing is snapshotted before the pace is known; auto measures one
    step first and agrees at the second call."""
    return Cadence(every=config.every_steps or 1, last_step=from_step)


def needs_agreement(config: CadenceConfig, cadence: Cadence, step: int) -> bool:
    """Does this call agree on k (collective in auto mode)? Where k as it stands makes `step` a
    snapshot step, once a pace is measured: auto starts at k = 1, so the second call after a start
    agrees (the first pace), then each snapshot step. The same steps on every rank."""
    return config.is_auto and cadence.mark_step is not None and step - cadence.last_step >= cadence.every


def proposal(config: CadenceConfig, cadence: Cadence, step: int, now: float) -> int:
    """The k this rank proposes at `step`: the steps that fit into the interval at the pace
    measured since the mark (1 when nothing is measured yet)."""
    if not config.is_auto:
        return config.every_steps
    if cadence.mark_step is None or step <= cadence.mark_step or now <= cadence.mark_at:
        return 1
    per_step_s = (now - cadence.mark_at) / (step - cadence.mark_step)
    return max(1, min(MAX_EVERY_STEPS, math.ceil(config.interval_s / per_step_s)))


def observe(config: CadenceConfig, cadence: Cadence, step: int, now: float, agreed_every: int | None) -> tuple[Cadence, bool]:
    """Folds one call at `step` (with the agreed k when this call agreed) into the cadence; returns
    the new cadence and whether `step` is a snapshot step. The pace is measured from the first call
    after a start, then from each snapshot step."""
    if agreed_every is not None and agreed_every < 1:
        raise ValueError(f"agreed snapshot cadence must be >= 1 step, got {agreed_every}")
    if config.is_auto and cadence.mark_step is None:
        return Cadence(cadence.every, cadence.last_step, step, now), False  # the pace's origin
    every = agreed_every if agreed_every is not None else cadence.every
    if step - cadence.last_step >= every:
        return Cadence(every, step, step, now), True
    return Cadence(every, cadence.last_step, cadence.mark_step, cadence.mark_at), False
