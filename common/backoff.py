"""Retry schedule shared by every shell that reconnects (agent link, peers, later etcd and S3).

Pure: the caller passes the attempt number and a seeded `random.Random`, and sleeps itself.
Keeping one policy in one place means every retry loop has a deadline and jitter, and tests can
check the schedule without sleeping.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter and an optional overall deadline."""

    initial_s: float = 0.05
    max_s: float = 2.0
    factor: float = 2.0
    jitter: float = 0.5  # fraction of the delay drawn at random, 0 = none, 1 = full jitter
    deadline_s: float | None = None  # give up after this much total waiting; None = never

    def __post_init__(self) -> None:
        for name in ("initial_s", "max_s", "factor"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Backoff.{name} must be a positive finite number, got {value!r}")
        if self.max_s < self.initial_s:
            raise ValueError(f"Backoff.max_s ({self.max_s}) is below initial_s ({self.initial_s})")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"Backoff.jitter must be within [0, 1], got {self.jitter!r}")
        if self.deadline_s is not None and not (
            math.isfinite(self.deadline_s) and self.deadline_s > 0
        ):
            raise ValueError(f"Backoff.deadline_s must be positive, got {self.deadline_s!r}")

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry number `attempt` (0-based)."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        ceiling = min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))
        return ceiling * (1.0 - self.jitter * rng.random())

    def is_exhausted(self, waited_s: float) -> bool:
        """True once the total time spent waiting has passed the deadline."""
        return self.deadline_s is not None and waited_s >= self.deadline_s
