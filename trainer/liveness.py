"""Level 1 liveness: `session.heartbeat()` and named phases with their own hang limits.

Owns what the rank tells its agent about being alive between step reports: a heartbeat, or
entering and leaving a phase (`with session.phase("eval", timeout_s=1800): ...`), so evaluation,
checkpoint saves and data stalls are not taken for hangs. Phases nest; the innermost one's limit
applies, and leaving it restores the enclosing one. Heartbeats are sent at most once per
`MIN_INTERVAL_S` (a tight loop may call it freely); a phase change is always sent. A report that
cannot reach the agent is logged, never raised: a lost heartbeat risks only a hang verdict.
Imports no daemon code (trainer side of the layering).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator

from ftsup.v1 import peer_pb2

MIN_INTERVAL_S = 1.0
MAX_PHASE_TIMEOUT_S = 7 * 24 * 3600.0  # the agent refuses more (agent/core/hang.py)
MAX_PHASE_NAME = 128

log = logging.getLogger(__name__)

Send = Callable[[peer_pb2.LivenessReport], None]


class Liveness:
    def __init__(self, send: Send, identity: Callable[[], tuple[int, int]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._identity = identity  # (generation, rank) now: a rank that rejoined in-process moves
        self._clock = clock
        self._phases: list[tuple[str, float]] = []
        self._last_sent_s = -math.inf

    @property
    def phase_name(self) -> str:
        return self._phases[-1][0] if self._phases else ""

    def heartbeat(self) -> None:
        """The rank is alive (progress for the agent's hang watcher), rate-limited."""
        if self._clock() - self._last_sent_s >= MIN_INTERVAL_S:
            self._report()

    @contextlib.contextmanager
    def phase(self, name: str, timeout_s: float = 0.0) -> Iterator[None]:
        """Inside, the hang limit is `timeout_s` (0: the step-time based one) counted from the
        last heartbeat or phase change."""
        if not name or len(name) > MAX_PHASE_NAME:
            raise ValueError(f"phase name must be 1..{MAX_PHASE_NAME} characters, got {name!r}")
        if not (math.isfinite(timeout_s) and 0 <= timeout_s <= MAX_PHASE_TIMEOUT_S):
            raise ValueError(f"phase timeout_s must be within [0, {MAX_PHASE_TIMEOUT_S:g}], got {timeout_s!r}")
        self._phases.append((name, float(timeout_s)))
        self._report()
        try:
            yield
        finally:
            self._phases.pop()
            self._report()

    def _report(self) -> None:
        name, timeout_s = self._phases[-1] if self._phases else ("", 0.0)
        generation, rank = self._identity()
        report = peer_pb2.LivenessReport(generation=generation, rank=rank, phase=name,
                                         phase_timeout_s=timeout_s)
        self._last_sent_s = self._clock()
        try:
            self._send(report)
        except Exception as exc:
            log.warning("ftsup: liveness report (phase %r) not delivered: %s", name, exc)
