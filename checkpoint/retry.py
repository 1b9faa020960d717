"""Retrying a store call under the project's `Backoff` (common/backoff.py), in one place.

botocore's own retries are switched off in S3Store so that this is the only retry loop: every
attempt is logged with its cause, the deadline counts real elapsed time (a slow response spends it
too), and giving up raises StoreUnavailable naming the operation, attempts and last cause. The
clock and sleep are injectable so the schedule is unit-tested without sleeping.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ftsup.checkpoint.errors import StoreUnavailable
from ftsup.common.backoff import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_BACKOFF = Backoff(initial_s=0.1, max_s=5.0, factor=2.0, jitter=0.5, deadline_s=120.0)


@dataclass
class Retrier:
    backoff: Backoff = DEFAULT_BACKOFF
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic

    def call(self, what: str, fn: Callable[[], T], is_retryable: Callable[[BaseException], bool]) -> T:
        """`fn()`, retried while it raises retryable errors and the deadline allows another attempt."""
        started = self.monotonic()
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                delay = self.backoff.delay_s(attempt, self.rng)
                elapsed = self.monotonic() - started
                if self.backoff.is_exhausted(elapsed + delay):
                    raise StoreUnavailable(
                        f"{what}: gave up after {attempt + 1} attempts in {elapsed:.1f}s"
                        f" (deadline {self.backoff.deadline_s}s): {exc}"
                    ) from exc
                log.warning("%s failed (attempt %d, retrying in %.2fs): %s", what, attempt + 1, delay, exc)
                self.sleep(delay)
                attempt += 1
