"""In-memory EventLog: the twin used by unit tests and the simulator; same contract, no disk."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence

from supervisor.core.events import Event, Record
from supervisor.eventlog.cache import RecordCache


class MemoryLog:
    def __init__(self) -> None:
        self._cache = RecordCache()

    @property
    def head_seq(self) -> int:
        return self._cache.head_seq

    async def append(self, events: Sequence[Event], *, term: int, time_unix_s: float) -> list[Record]:
        start = self.head_seq + 1
        records = [Record(start + i, term, time_unix_s, event) for i, event in enumerate(events)]
        await self._cache.publish(records)
        return records

    def read(self, since_seq: int = 1) -> Iterator[Record]:
        return self._cache.read(since_seq)

    def follow(self, since_seq: int = 1) -> AsyncIterator[Record]:
        return self._cache.follow(since_seq)

    def close(self) -> None:
        pass
