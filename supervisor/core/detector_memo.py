"""The failure detector's memo: the earliest time its next pass over the fleet can find anything.

`policies/failure.judge` runs on every Tick (ten a second) and walked every node each time: at
12,500 nodes that pass was the largest steady cost on the leader that grew with the fleet and not
with its traffic (issue 14: ~2.5 ms a pass at 2,000 nodes under the profiler, a tenth of the
leader's loop). Most passes find nothing: a connected, alive node last heard at `t` can get no
verdict before `t + min(dead_after, 1.5 x interval)`. A pass therefore notes the oldest such
`t`, and the next Tick before that deadline returns no verdict without walking the fleet, as long
as nothing the pass read has changed:
- the node map (held and compared by identity: the state is persistent, so any node record
  changed, added or removed is a new map), the detector's configuration, the grace's start;
- soft state other than "heard": a Hello, a closed stream, clocks moved by a stall or a shard's
  quiet (`changed()`);
- a node heard at an earlier time than the one the pass saw (inputs are decided as of their
  arrival: `heard(now)` lowers the deadline, one comparison per input, not per node).
Any node that is not connected and alive (a suspect, a closed stream, one never heard, a clock
that is not a number) makes every Tick pass, as before. Verdicts are the same with or without the
memo, only slower without (tests/unit/supervisor/test_detector_memo.py compares both over
random histories). A fresh SoftState (a new leader) starts with an empty one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ftsup.supervisor.core.config import DetectorConfig

_ALWAYS = -math.inf  # the next Tick passes


class DetectorMemo:
    """Owned by the caller's SoftState (`detector_memo`), like the planners' PlanMemo."""

    __slots__ = ("_config", "_nodes", "_quiet_below_s", "_started_at_s", "next_pass_s", "passes", "skips")

    def __init__(self) -> None:
        self._nodes: Mapping[str, object] | None = None
        self._config: DetectorConfig | None = None
        self._started_at_s = math.nan
        self._quiet_below_s = 0.0
        self.next_pass_s = _ALWAYS
        self.passes = 0  # (for tests and the bench: how often the fleet was walked)
        self.skips = 0

    def can_skip(self, nodes: Mapping[str, object], config: DetectorConfig, started_at_s: float, now: float) -> bool:
        """True when a pass at `now` would find no verdict (see the module's docstring)."""
        if (now < self.next_pass_s and nodes is self._nodes and started_at_s == self._started_at_s
                and (config is self._config or config == self._config)):
            self.skips += 1
            return True
        return False

    def passed(self, nodes: Mapping[str, object], config: DetectorConfig, started_at_s: float,
               quiet_below_s: float, oldest_heard_s: float | None) -> None:
        """A pass walked `nodes`: `oldest_heard_s` is the oldest grace-adjusted time a connected,
        alive node was heard (math.inf: none), None when some node must be looked at each Tick."""
        self.passes += 1
        self._nodes, self._config, self._started_at_s = nodes, config, started_at_s
        self._quiet_below_s = quiet_below_s
        self.next_pass_s = _ALWAYS if oldest_heard_s is None else oldest_heard_s + quiet_below_s

    def heard(self, now: float) -> None:
        """A node was heard at `now`: its deadline is no earlier than this (a NaN `now` gives it
        none: judge finds no verdict on a clock that is not a number)."""
        due = now + self._quiet_below_s
        if due < self.next_pass_s:
            self.next_pass_s = due

    def changed(self) -> None:
        """Soft state the detector reads changed in another way than a node heard: pass next Tick."""
        self.next_pass_s = _ALWAYS
