"""Directives owed to nodes: a push larger than a slice goes out over several turns of the loop.

A directive is a projection of the state (core/directives.py), so a node's directive built a few
turns later, from that turn's state, is the one it should hold then: a later decision naming the
node is not overtaken by an older projection, and a node pushed again meanwhile is simply
pushed once. What this owns is the order (first owed, first pushed), a log line for a push that
took several turns (an operator sees when the last node was directed), and the slices' time.

That time is forgiven to every node's silence, as a stall of the loop is (Tick.stalled_s). Between
slices the loop reads what arrived, but no agent stream is read during one, and a ticker that the
slices keep on time would not see the stall the one long turn showed it: a first attempt at slicing
the push (issue 14, part 1) measured more false deaths than the single turn for that reason.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any


class OwedPushes:
    """Owned by the runtime: `split` every push's targets, `take` a slice per turn while owed."""

    def __init__(self, slice_nodes: int, logger: Any, clock: Callable[[], float] = time.monotonic) -> None:
        if slice_nodes < 1:
            raise ValueError(f"a push slice must be >= 1 node, got {slice_nodes}")
        self.slice_nodes = slice_nodes
        self._logger = logger
        self._clock = clock
        self._owed: dict[str, None] = {}  # node ids in the order they are owed (an ordered set)
        self._started_s = 0.0
        self._nodes = 0  # owed since the first unfinished split
        self._busy_s = 0.0  # spent pushing slices since the ticker last asked

    def __bool__(self) -> bool:
        return bool(self._owed)

    def __len__(self) -> int:
        return len(self._owed)

    def split(self, targets: list[str], generation: int | None) -> list[str]:
        """The targets to push now; the rest (past a slice) are owed. A node pushed now is no
        longer owed (a directive from this turn's state replaces a later one from the same)."""
        now, later = targets[: self.slice_nodes], targets[self.slice_nodes :]
        for node_id in now:
            self._owed.pop(node_id, None)
        if later:
            if not self._owed:
                self._started_s, self._nodes = self._clock(), len(targets)
                self._logger.info("directives pushed over several turns", nodes=len(targets),
                                  per_turn=self.slice_nodes, generation=generation)
            self._owed.update(dict.fromkeys(later))
        return now

    def take(self, generation: int | None) -> list[str]:
        """The next slice of owed nodes (no longer owed once taken)."""
        taken = list(itertools.islice(self._owed, self.slice_nodes))
        for node_id in taken:
            del self._owed[node_id]
        if taken and not self._owed:
            self._logger.info("directive push done", nodes=self._nodes,
                              seconds=round(self._clock() - self._started_s, 3), generation=generation)
        return taken

    def note_busy(self, seconds: float) -> None:
        """Time the loop spent on a sliced push: no agent stream was read meanwhile."""
        self._busy_s += seconds

    def take_busy_s(self) -> float:
        """The slices' time since the last call (the ticker forgives it, as a stall, to every node)."""
        busy, self._busy_s = self._busy_s, 0.0
        return busy

    def clear(self) -> None:
        self._owed.clear()
