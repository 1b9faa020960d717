"""Bounded queue of reports waiting to reach the supervisor.

Pure (no asyncio): the link wraps it with a wake-up event. Reports produced while disconnected
wait here. The rule: when full, drop the oldest droppable report (step reports first, then other
droppable kinds); never drop an essential one (TrainerExit, RankFinished), even past the bound,
because the supervisor cannot rebuild those from later messages.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Generic, TypeVar

T = TypeVar("T")


class Priority(enum.IntEnum):
    """Lower is dropped first."""

    STEP = 0  # superseded by the next step report
    REPORT = 1  # e.g. snapshot reports: useful, but a later step's supersedes them
    ESSENTIAL = 2  # trainer exits, finished ranks: never dropped


@dataclass(slots=True)
class _Entry(Generic[T]):
    seq: int
    priority: Priority
    item: T


class Outbox(Generic[T]):
    """FIFO of items with a soft capacity and priority-based dropping."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"Outbox capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._entries: deque[_Entry[T]] = deque()
        self._seq = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, item: T, priority: Priority) -> None:
        self._entries.append(_Entry(self._seq, priority, item))
        self._seq += 1
        while len(self._entries) > self._capacity and self._drop_one():
            self.dropped += 1

    def _drop_one(self) -> bool:
        for level in (Priority.STEP, Priority.REPORT):
            for entry in self._entries:
                if entry.priority is level:
                    self._entries.remove(entry)
                    return True
        return False

    def peek(self) -> T | None:
        return self._entries[0].item if self._entries else None

    def pop(self) -> T:
        return self._entries.popleft().item

    def head(self, limit: int) -> list[T]:
        """The first `limit` items (fewer when fewer are queued), oldest first, left queued."""
        return [entry.item for entry in islice(self._entries, limit)]

    def remove(self, items: list[T]) -> None:
        """Takes these items (by identity) out, wherever they are; ones already gone are skipped."""
        wanted = {id(item) for item in items}
        while self._entries and id(self._entries[0].item) in wanted:  # the usual case: the head
            wanted.discard(id(self._entries.popleft().item))
        if wanted:
            self._entries = deque(e for e in self._entries if id(e.item) not in wanted)
