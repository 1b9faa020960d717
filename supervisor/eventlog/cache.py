"""The durable records held in memory, with read-from-seq and follow: shared by every backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

from supervisor.core.events import Record


class RecordCache:
    def __init__(self) -> None:
        self._records: list[Record] = []
        self._appended = asyncio.Condition()

    @property
    def head_seq(self) -> int:
        return len(self._records)

    def load(self, record: Record) -> None:
        """Adds a record read back at open time (no waiters exist yet)."""
        self._records.append(record)

    async def publish(self, records: list[Record]) -> None:
        """Makes durable records visible to readers and wakes followers."""
        self._records.extend(records)
        async with self._appended:
            self._appended.notify_all()

    def read(self, since_seq: int = 1) -> Iterator[Record]:
        yield from self._records[max(since_seq, 1) - 1 :]

    async def follow(self, since_seq: int = 1) -> AsyncIterator[Record]:
        next_seq = max(since_seq, 1)
        while True:
            for record in self._records[next_seq - 1 :]:
                yield record
                next_seq = record.seq + 1
            async with self._appended:
                await self._appended.wait_for(lambda: self.head_seq >= next_seq)
