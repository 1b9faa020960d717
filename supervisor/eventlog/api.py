"""The EventLog seam: what every log backend (memory twin, embedded files, etcd) promises.

append() returns only once its records are durable and assigns gapless seqs; with `expect_seq`
it is conditional (the head must be exactly that), which is how a deposed writer is fenced out.
read()/follow() return records in seq order. A snapshot stores the folded state at some seq so
replay starts there; compact() drops records a retained snapshot covers. Errors are translated at
the boundary into this hierarchy and say whether retrying can help.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Protocol

from ftsup.supervisor.core.events import Event, Record
from ftsup.supervisor.core.state import ClusterState


class LogError(Exception):
    """Base of event log failures."""

    retryable = False


class LogUnavailable(LogError):
    """The storage cannot be written or read right now (full disk, I/O error, lost quorum)."""

    retryable = True


class LogCorrupt(LogError):
    """Stored data fails its checks before the tail; the text names the file and the offset."""


class LogFormatError(LogError):
    """The directory was written in a format this version cannot read (e.g. a newer one)."""


class LogLocked(LogError):
    """Another process holds the log (a second supervisor on the same directory)."""


class Fenced(LogError):
    """A conditional append lost: the head moved (another writer appended). Do not retry blindly."""

    def __init__(self, expected_seq: int, head_seq: int) -> None:
        super().__init__(f"append expected head seq {expected_seq}, but the head is {head_seq}")
        self.expected_seq = expected_seq
        self.head_seq = head_seq


class Deposed(Fenced):
    """A fenced append lost because its term no longer holds the leader key (a newer leader, or
    none: the lease expired). The writer must stop deciding and follow; retrying cannot help."""

    def __init__(self, term: int, current_term: int, head_seq: int) -> None:
        holder = f"term {current_term}" if current_term else "no leader (its lease expired or was revoked)"
        LogError.__init__(self, f"append at term {term} is fenced: the leader key now holds {holder}")
        self.expected_seq = head_seq
        self.head_seq = head_seq
        self.term = term
        self.current_term = current_term


class LogCompacted(LogError):
    """The records asked for were compacted away after a snapshot covered them."""

    def __init__(self, since_seq: int, first_seq: int) -> None:
        super().__init__(
            f"records before seq {first_seq} were compacted after a snapshot; asked from {since_seq}"
        )
        self.since_seq = since_seq
        self.first_seq = first_seq


class EventLog(Protocol):
    @property
    def head_seq(self) -> int:
        """Seq of the last durable record; 0 when empty."""
        ...

    @property
    def first_seq(self) -> int:
        """The oldest seq still readable (1 until a compaction)."""
        ...

    async def append(
        self, events: Sequence[Event], *, term: int, time_unix_s: float, expect_seq: int | None = None
    ) -> list[Record]:
        """Appends `events` as consecutive records, atomically, and returns them once durable."""
        ...

    def read(self, since_seq: int = 1) -> Iterator[Record]:
        """Records with seq >= since_seq that are durable now; LogCompacted if since is gone."""
        ...

    def follow(self, since_seq: int = 1) -> AsyncIterator[Record]:
        """Like read(), then waits for and yields new records as they are appended."""
        ...

    async def save_snapshot(self, state: ClusterState) -> None:
        """Stores `state` (folded up to state.applied_seq) durably."""
        ...

    def load_snapshot(self) -> ClusterState | None:
        """The newest readable snapshot, or None; replay continues from its applied_seq + 1."""
        ...

    async def compact(self) -> int:
        """Drops records covered by the oldest retained snapshot; returns how many."""
        ...

    def close(self) -> None: ...
