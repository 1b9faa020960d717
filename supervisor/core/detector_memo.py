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
A node that is not connected and alive and heard lately (a suspect, an overdue node, a closed
stream, one never heard, a clock that is not a number), or whose deadline is near (silent for
more than failure.WATCH_AHEAD_FRACTION short of it: a loaded fleet always has a few nodes heard
late, and theirs made every Tick a whole pass, part 16), is *watched*: until the deadline or a
change, each Tick judges the watched nodes alone (in the fleet's order), not the fleet. A node
silenced at 12,500 nodes used to make every Tick from its first overdue moment to its death a
whole pass (~25 passes of ~10 ms each per failure, part 15); its Ticks now cost a few operations
per watched node. Verdicts are the same with or without the memo, only slower without
(tests/unit/supervisor/test_detector_memo.py compares both over random histories). A fresh
SoftState (a new leader) starts with an empty one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ftsup.supervisor.core.config import DetectorConfig

_ALWAYS = -math.inf  # the next Tick passes


class DetectorMemo:
    """Owned by the caller's SoftState (`detector_memo`), like the planners' PlanMemo."""

    __slots__ = ("_config", "_nodes", "_quiet_below_s", "_started_at_s", "next_pass_s", "partials", "passes",
                 "skips", "watched")

    def __init__(self) -> None:
        self._nodes: Mapping[str, object] | None = None
        self._config: DetectorConfig | None = None
        self._started_at_s = math.nan
        self._quiet_below_s = 0.0
        self.next_pass_s = _ALWAYS
        self.watched: tuple[str, ...] = ()  # nodes each Tick judges until the next whole pass
        self.passes = 0  # (for tests and the bench: how often the fleet was walked...)
        self.partials = 0  # (...how often only the watched nodes were...)
        self.skips = 0  # (...and how often nothing was)

    def to_judge(self, nodes: Mapping[str, object], config: DetectorConfig, started_at_s: float,
                 now: float) -> tuple[str, ...] | None:
        """What a pass at `now` must look at: None, every node; else only these (empty: none),
        as no other node can have a verdict yet (see the module's docstring)."""
        if (now < self.next_pass_s and nodes is self._nodes and started_at_s == self._started_at_s
                and (config is self._config or config == self._config)):
            if self.watched:
                self.partials += 1
            else:
                self.skips += 1
            return self.watched
        return None

    def passed(self, nodes: Mapping[str, object], config: DetectorConfig, started_at_s: float,
               quiet_below_s: float, oldest_heard_s: float, watched: list[str]) -> None:
        """A pass walked `nodes`: `oldest_heard_s` is the oldest grace-adjusted time a connected,
        alive node was heard lately (math.inf: none); `watched`, the nodes to judge on every Tick."""
        self.passes += 1
        self._nodes, self._config, self._started_at_s = nodes, config, started_at_s
        self._quiet_below_s = quiet_below_s
        self.next_pass_s = oldest_heard_s + quiet_below_s
        self.watched = tuple(watched)

    def judged_watched(self, oldest_heard_s: float, watched: list[str]) -> None:
        """A pass judged the watched nodes alone: those that are now connected, alive and heard
        lately leave the watch, their deadline joining the fleet's."""
        self.heard(oldest_heard_s)
        if len(watched) != len(self.watched):
            self.watched = tuple(watched)

    def heard(self, now: float) -> None:
        """A node was heard at `now`: its deadline is no earlier than this (a NaN `now` gives it
        none: judge finds no verdict on a clock that is not a number)."""
        due = now + self._quiet_below_s
        if due < self.next_pass_s:
            self.next_pass_s = due

    def changed(self) -> None:
        """Soft state the detector reads changed in another way than a node heard: pass next Tick."""
        self.next_pass_s = _ALWAYS
