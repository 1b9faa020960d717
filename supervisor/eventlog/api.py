"""The EventLog seam: what every log backend (memory twin, embedded files, etcd) promises.

append() returns only after the records are durable; read() and follow() return records in seq
order with no gaps. Errors are translated at the boundary into this small hierarchy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Protocol

from supervisor.core.events import Event, Record


class LogError(Exception):
    """Base of event log failures."""


class LogUnavailable(LogError):
    """Retryable: the storage cannot be reached or written right now."""


class LogCorrupt(LogError):
    """Fatal: stored records fail their checks before the tail; the text names file and offset."""


class EventLog(Protocol):
    @property
    def head_seq(self) -> int:
        """Seq of the last durable record; 0 when empty."""
        ...

    async def append(self, events: Sequence[Event], *, term: int, time_unix_s: float) -> list[Record]:
        """Appends `events` as consecutive records, atomically, and returns them once durable."""
        ...

    def read(self, since_seq: int = 1) -> Iterator[Record]:
        """Records with seq >= since_seq that are durable now."""
        ...

    def follow(self, since_seq: int = 1) -> AsyncIterator[Record]:
        """Like read(), then waits for and yields new records as they are appended."""
        ...

    def close(self) -> None: ...
