"""The runtime's stream-input slots, taken and given back in bulk.

Agents' inputs wait for room in the leader's queue (back-pressure instead of unbounded memory:
STREAM_INPUT_CAPACITY). A link shard's run or fold of forty nodes' messages takes forty slots: with
a semaphore that was forty acquires and, once the loop took the run, forty releases, each a few
microseconds of the leader's loop, ~5 % of its CPU at 6,000 nodes (issue 14). Here a run takes
its slots at once.

Waiters are served first come, first served: a run waits until all its slots are free, and nothing
behind it goes first, so a stream of single inputs cannot starve it. A waiter cancelled before its
grant takes nothing; a grant that meets a cancellation is given back, so no slot leaks
(CancelledError is a BaseException: every exit path is covered).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class SlotPool:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a slot pool needs at least one slot, got {capacity}")
        self.capacity = capacity
        self._free = capacity
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def free(self) -> int:
        """Slots nobody holds."""
        return self._free

    async def take(self, count: int) -> None:
        """Waits until `count` slots are free and nobody waits ahead, then holds them."""
        if not 0 <= count <= self.capacity:
            raise ValueError(f"{count} slots asked of a pool of {self.capacity}")
        if count == 0:
            return
        if not self._waiters and self._free >= count:
            self._free -= count
            return
        entry = (count, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            await entry[1]
        except BaseException:
            if entry[1].done() and not entry[1].cancelled():
                self.give(count)  # granted as it was cancelled: back to the pool
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._wake()  # (a waiter behind it may fit now)
            raise

    def give(self, count: int) -> None:
        """Gives back `count` held slots and grants waiters in order while they fit."""
        self._free += count
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            count, waiter = waiters[0]
            if waiter.done():  # (cancelled while queued)
                waiters.popleft()
                continue
            if count > self._free:
                return
            waiters.popleft()
            self._free -= count
            waiter.set_result(None)
