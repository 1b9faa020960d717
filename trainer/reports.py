"""The messages a rank sends its agent besides snapshots: step reports and checkpoint shards, in order.

Owns the FIFO: one background thread sends them in the order they were made (the supervisor must
see a rank's step report before its checkpoint shard of that step), at most MAX_PENDING_REPORTS
wait (a caller beyond that waits for the oldest: bounded memory), and a send's error surfaces on
the training thread at the next call instead of vanishing in the thread. Also the argument checks
a report's values must pass before they are queued.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

MAX_PENDING_REPORTS = 256

M = TypeVar("M")


class ReportQueue:
    """Sends queued messages in order on one background thread."""

    def __init__(self) -> None:
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="ftsup-report")
        self._pending: deque[Future[None]] = deque()

    def submit(self, send: Callable[[M], None], message: M) -> None:
        """Queues `send(message)`; raises the error of an earlier send that failed."""
        self.raise_errors()
        if len(self._pending) >= MAX_PENDING_REPORTS:
            self._pending.popleft().result()
        self._pending.append(self._worker.submit(send, message))

    def raise_errors(self) -> None:
        """Re-raises the first error among the sends already done (in order)."""
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()

    def flush(self) -> None:
        """Until every queued message is sent; raises the first error."""
        while self._pending:
            self._pending.popleft().result()

    def drop(self, timeout_s: float) -> None:
        """Forgets the queue (a broken generation's messages), waiting at most `timeout_s` for each."""
        for pending in list(self._pending):
            try:
                pending.result(timeout=timeout_s)
            except Exception:
                pass  # sent or not: the agent refuses the old generation's messages now
        self._pending.clear()

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")


def check_duration(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
