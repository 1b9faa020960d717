"""In-memory EventLog: the twin used by unit tests and the simulator; same contract, no disk."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence

from ftsup.supervisor.core.events import Event, Record
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.api import Fenced, LogCompacted
from ftsup.supervisor.eventlog.follow import AppendSignal

KEEP_SNAPSHOTS = 2


class MemoryLog:
    def __init__(self) -> None:
        self._records: list[Record] = []
        self._first = 1  # seq of self._records[0]
        self._snapshots: list[ClusterState] = []
        self._appended = AppendSignal()

    @property
    def head_seq(self) -> int:
        return self._first + len(self._records) - 1

    @property
    def first_seq(self) -> int:
        return self._first

    async def append(
        self, events: Sequence[Event], *, term: int, time_unix_s: float, expect_seq: int | None = None
    ) -> list[Record]:
        if expect_seq is not None and expect_seq != self.head_seq:
            raise Fenced(expect_seq, self.head_seq)
        start = self.head_seq + 1
        records = [Record(start + i, term, time_unix_s, event) for i, event in enumerate(events)]
        self._records.extend(records)
        await self._appended.notify()
        return records

    def read(self, since_seq: int = 1) -> Iterator[Record]:
        since = max(since_seq, 1)
        if since < self._first:
            raise LogCompacted(since, self._first)
        return iter(self._records[since - self._first :])

    def follow(self, since_seq: int = 1) -> AsyncIterator[Record]:
        return self._appended.follow(self.read, lambda: self.head_seq, since_seq)

    async def save_snapshot(self, state: ClusterState) -> None:
        if state.applied_seq > self.head_seq:
            raise ValueError(f"snapshot at seq {state.applied_seq} is beyond the log head {self.head_seq}")
        self._snapshots = [*self._snapshots, state][-KEEP_SNAPSHOTS:]

    def load_snapshot(self) -> ClusterState | None:
        return self._snapshots[-1] if self._snapshots else None

    async def compact(self) -> int:
        if not self._snapshots:
            return 0
        covered = self._snapshots[0].applied_seq
        drop = max(0, covered + 1 - self._first)
        del self._records[:drop]
        self._first += drop
        return drop

    def close(self) -> None:
        pass
