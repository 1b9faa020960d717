"""Refused inputs in the supervisor's log: each one while they are few, a count once they are many.

A failure's tail at 12,500 nodes is every node's last step arriving after its generation ended:
12,500 refusals within a second or two, each a warning line of its own (~250 µs of the leader's
loop apiece, measured under the profiler in issue 14, part 15) and a journal of lines saying the
same thing, just when an operator reads it for the failure. So the first `burst` refusals of each
window are logged one by one with their reasons, and past that they are counted by input type;
the window's first tick after its end logs one line with the counts and each type's last reason.
Every refusal is still counted in the metrics (`ftsup_inputs_refused_total{input}`), with or
without a line of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REFUSALS_LOGGED_PER_WINDOW = 20
REFUSAL_WINDOW_S = 10.0


@dataclass(slots=True)
class _Unlogged:
    count: int
    last_reason: str
    last_node_id: str | None


class RefusalLog:
    """Owned by the runtime; `now` is its monotonic clock."""

    def __init__(self, logger: Any, *, per_window: int = REFUSALS_LOGGED_PER_WINDOW,
                 window_s: float = REFUSAL_WINDOW_S) -> None:
        self._logger = logger
        self.per_window = per_window
        self.window_s = window_s
        self._window_started_s: float | None = None
        self._logged = 0
        self._unlogged: dict[str, _Unlogged] = {}  # by input type: as many keys as input types

    def refused(self, input_type: str, reason: str, now: float, *, node_id: str | None,
                generation: int | None) -> None:
        self.roll(now, generation)
        if self._window_started_s is None:
            self._window_started_s = now  # (a window opens at its first refusal)
        if self._logged < self.per_window:
            self._logged += 1
            self._logger.warning("input refused", input=input_type, reason=reason, node_id=node_id,
                                 generation=generation)
            return
        held = self._unlogged.get(input_type)
        if held is None:
            self._unlogged[input_type] = _Unlogged(1, reason, node_id)
        else:
            held.count += 1
            held.last_reason, held.last_node_id = reason, node_id

    def roll(self, now: float, generation: int | None) -> None:
        """Closes the window once it is over, logging what it did not log one by one (the runtime
        calls this on every tick too, so a burst's count is logged within a tick of its window's
        end, not at the next refusal, which may never come)."""
        started = self._window_started_s
        if started is None or now - started < self.window_s:
            return
        if self._unlogged:
            self._logger.warning(
                "inputs refused, not logged one by one", window_s=self.window_s, logged=self._logged,
                counts={kind: held.count for kind, held in self._unlogged.items()},
                last_reasons={kind: held.last_reason for kind, held in self._unlogged.items()},
                last_node_ids={kind: held.last_node_id for kind, held in self._unlogged.items()},
                generation=generation)
            self._unlogged = {}
        self._window_started_s = None
        self._logged = 0
