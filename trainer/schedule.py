"""A rank's snapshot schedule: the pure cadence (trainer/core/cadence.py) plus the clock and the agreement.

Owns the shell around the cadence: reads the configuration from the environment
(FTSUP_SNAPSHOT_EVERY_STEPS: a fixed k, 1 = every step; FTSUP_SNAPSHOT_INTERVAL_S: auto's target,
default 1 s), stamps `now`, and at each snapshot step agrees on the next k with the other ranks
(one all-reduce of the minimum proposal, in auto mode only). It also remembers which step was
snapshotted last, so a trainer digests its local gradients only for the steps an SDC recompute
can replay (the step after a snapshot: the replay starts from that snapshot).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ftsup.trainer import collective
from ftsup.trainer.core import cadence as core

EVERY_ENV = "FTSUP_SNAPSHOT_EVERY_STEPS"
INTERVAL_ENV = "FTSUP_SNAPSHOT_INTERVAL_S"


def config_from_mapping(env: Mapping[str, str]) -> core.CadenceConfig:
    """The cadence the environment asks for (unset: auto at the default interval)."""
    every_raw, interval_raw = env.get(EVERY_ENV, ""), env.get(INTERVAL_ENV, "")
    try:
        every = int(every_raw) if every_raw else 0
    except ValueError:
        raise ValueError(f"{EVERY_ENV}={every_raw!r} is not an integer (0: auto, 1: every step)") from None
    try:
        interval = float(interval_raw) if interval_raw else core.DEFAULT_INTERVAL_S
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV}={interval_raw!r} is not a number of seconds") from None
    try:
        return core.CadenceConfig(every, interval)
    except ValueError as exc:
        raise ValueError(f"{EVERY_ENV}={every_raw!r} / {INTERVAL_ENV}={interval_raw!r}: {exc}") from None


class Schedule:
    """`is_due(step)` on every rank at every step; collective at agreement steps in auto mode."""

    def __init__(self, config: core.CadenceConfig, clock: Callable[[], float] = time.monotonic,
                 agree: Callable[[int], int] = collective.agree_on_min) -> None:
        self.config = config
        self._clock = clock
        self._agree = agree
        self._cadence = core.start(config, 0)
        self.snapshotted_step: int | None = None  # the last step handed to snapshot(), or restored

    @property
    def every(self) -> int:
        """The current k: a failure now loses at most this many steps."""
        return self._cadence.every

    def is_due(self, step: int) -> bool:
        now = self._clock()
        agreed = None
        if core.needs_agreement(self.config, self._cadence, step):
            agreed = self._agree(core.proposal(self.config, self._cadence, step, now))
        self._cadence, due = core.observe(self.config, self._cadence, step, now, agreed)
        return due

    def is_recomputable(self, step: int) -> bool:
        """Can an SDC recompute replay `step`? Only from this rank's snapshot of the step before."""
        return self.snapshotted_step is not None and self.snapshotted_step == step - 1

    def restart(self, from_step: int) -> None:
        """A start, restore or rejoin from `from_step` (held already): the cadence begins again there."""
        self._cadence = core.start(self.config, from_step)
