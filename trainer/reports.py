"""The messages a rank sends its agent besides snapshots: step reports and checkpoint shards, in order.

Owns the FIFO: one background thread sends them in the order they were made (the supervisor must
see a rank's step report before its checkpoint shard of that step), at most MAX_PENDING_REPORTS
wait (a caller beyond that waits for the oldest: bounded memory), and a send's error surfaces on
the training thread at the next call instead of vanishing in the thread. Also the window that
groups step reports (`StepWindow`): a step of a few tens of milliseconds would otherwise cost one
gRPC call per step, each a millisecond or two of CPU in the rank and more in the agent, on the
cores the training shares; their readers (hang and straggler detection, SDC votes, checkpoint
requests placed seconds ahead) need them within a fraction of a second, not at once. Also the
argument checks a report's values must pass before they are queued.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

MAX_PENDING_REPORTS = 256
WINDOW_ENV = "FTSUP_STEP_REPORT_WINDOW_S"
# Step reports of this long go to the agent together: well inside what their readers need (the
# supervisor places a requested checkpoint step >= 2 s ahead, hang limits are minutes), and a few
# calls per second whatever the step time. A step slower than this sends its report at once.
# Off unless asked for: a window delays what the supervisor knows of a rank's progress and when the
# rank learns of a requested checkpoint step by up to its length, so the supervisor's checkpoint
# lead (--checkpoint-lead-s, default 2 s) must exceed twice the window plus a step. Seen with a
# 0.3 s lead and a 0.25 s window: the ranks had passed the requested step before they heard of it.
DEFAULT_WINDOW_S = 0.0
MAX_WINDOW_S = 10.0

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


def window_from_mapping(env: Mapping[str, str]) -> float:
    """The step-report window FTSUP_STEP_REPORT_WINDOW_S asks for (unset: the default; 0: every
    report at once, one call each)."""
    raw = env.get(WINDOW_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_WINDOW_S
    except ValueError:
        raise ValueError(f"{WINDOW_ENV}={raw!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_WINDOW_S):
        raise ValueError(f"{WINDOW_ENV}={raw!r} must be within [0, {MAX_WINDOW_S:g}] seconds")
    return value


R = TypeVar("R")


class StepWindow(Generic[R]):
    """Groups step reports into one send per `window_s`, through the FIFO of a ReportQueue.

    The first report after a quiet window goes at once; the ones made within `window_s` of the
    last send wait on the sending thread (never the training thread) until the window has passed
    and go together, oldest first. `flush` sends what waits now and returns once it is sent (a
    checkpoint shard, the finish, must follow its step's report); `drop` forgets it. `wait` is
    how the sending thread waits out a window: `Event.wait(timeout)` of the hurry event, so a
    flush cuts it short (tests pass their own clock and wait)."""

    def __init__(self, queue: ReportQueue, send: Callable[[list[R]], None], window_s: float,
                 clock: Callable[[], float] = time.monotonic, wait: Callable[[float], object] | None = None) -> None:
        self._queue = queue
        self._send = send
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: list[R] = []
        self._scheduled = False  # a send of the waiting reports is queued and has not taken them yet
        self._last_sent_at: float | None = None
        self.hurry = threading.Event()  # set: the queued send goes now, without waiting out the window
        self._wait = wait if wait is not None else self.hurry.wait

    def add(self, report: R) -> None:
        """Queues `report`; raises the error of an earlier send that failed."""
        with self._lock:
            self._waiting.append(report)
            schedule, self._scheduled = not self._scheduled, True
        if schedule:
            self._queue.submit(self._send_waiting, None)
        else:
            self._queue.raise_errors()

    def flush(self) -> None:
        """Sends the waiting reports now (and everything queued before them); raises the first error."""
        self.hurry.set()
        try:
            self._queue.flush()
        finally:
            self.hurry.clear()

    def drop(self) -> None:
        """Forgets the waiting reports (a broken generation's: the agent refuses them now)."""
        with self._lock:
            self._waiting.clear()

    def _send_waiting(self, _: None) -> None:
        if self._last_sent_at is not None:
            left = self._last_sent_at + self.window_s - self._clock()
            if left > 0:
                self._wait(left)
        with self._lock:
            batch, self._waiting, self._scheduled = self._waiting, [], False
        self._last_sent_at = self._clock()
        if batch:
            self._send(batch)


def check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")


def check_duration(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
