"""Following a log: yield what is there, then wait for appends. Shared by the local backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

from ftsup.supervisor.core.events import Record


class AppendSignal:
    """Wakes followers after an append; the Condition is made lazily, inside the running loop."""

    def __init__(self) -> None:
        self._condition: asyncio.Condition | None = None

    def _get(self) -> asyncio.Condition:
        if self._condition is None:
            self._condition = asyncio.Condition()
        return self._condition

    async def notify(self) -> None:
        condition = self._get()
        async with condition:
            condition.notify_all()

    async def follow(
        self, read: Callable[[int], Iterator[Record]], head: Callable[[], int], since_seq: int
    ) -> AsyncIterator[Record]:
        next_seq = max(since_seq, 1)
        while True:
            for record in read(next_seq):
                yield record
                next_seq = record.seq + 1
            condition = self._get()
            wanted = next_seq
            async with condition:
                await condition.wait_for(lambda: head() >= wanted)  # noqa: B023 (awaited in this iteration)
