"""RAM snapshot store: verified payloads keyed by (rank, step), for this node's ranks and its buddies'.

Owns the bytes held, the bytes arriving, the memory limit over both and the retention rule
(agent/core/retention.py). The limit is derived from the job's own snapshot sizes and the ranks
this node answers for (agent/core/snapshot_budget.py), capped by half the RAM and by
`--snapshot-memory-mib` when given; it is recomputed as sizes and directives change. A snapshot enters as a stream through
`receive`: its declared size is reserved against the limit before a byte lands, the bytes go into
one lazily committed buffer of that size (common/chunks.py: RAM follows the bytes that arrived),
and only a complete payload whose SHA-256 matches
becomes visible to `get`; a stream that fails or is abandoned is discarded whole. Whatever is in
the store can therefore be handed out unchecked. Followers (the buddy forwarder) read an incoming
snapshot while it lands. The SHA-256 of an arriving snapshot is computed on a worker thread while
the bytes land (`Incoming.hashed`), so the event loop only copies them in and forwards them; it is
still checked over every byte before the snapshot is held. The buffer of a snapshot that retention
dropped is kept as a spare for the next one of a size near its own (`SPARE_FIT`): copying into a
fresh mapping faults in every page, and that was the largest cost of the hand-off left (copying
into reused memory was 3.7x faster on a GPU host). Spares count against the limit, are released
before a reservation is refused, and are reused only once nothing can read them anymore. No proto
imports: the services convert with agent/codec.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import mmap
import os
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ftsup.agent.core.retention import KEEP_STEPS_PER_RANK, keys_to_drop
from ftsup.agent.core.snapshot_budget import SnapshotBudget, snapshot_budget
from ftsup.common.chunks import (
    CHUNK_BYTES,
    Assembly,
    HashMismatch,
    InvalidSnapshot,
    OversizedStream,
    check_declared_size,
    check_sha256,
    lazy_buffer,
)

__all__ = ["Blob", "Incoming", "InvalidSnapshot", "SnapshotId", "SnapshotMemoryFull", "SnapshotStore", "verify"]


# A rank's snapshot may declare at most this many times the largest one of that rank this store
# held: a job's state keeps its size from step to step (optimizer moments fill in after the first
# step, within this factor), so a header far beyond it is a bug or an attack, refused at once.
SIZE_GROWTH_LIMIT = 4
# Hashing lanes: each arriving snapshot hashes on at most one of these threads at a time, once this
# much arrived unhashed (smaller remainders are hashed by `finish`, on the loop: a few ms at most).
HASH_THREADS = min(8, os.cpu_count() or 1)
HASH_OFFLOAD_BYTES = 1024 * 1024
_hash_pool: ThreadPoolExecutor | None = None
# Spare receive buffers: at most one per rank, the one its newest dropped (or discarded) snapshot
# left; retention drops one step per step that arrives, so one per rank is what the next arrival
# needs. A spare fits a snapshot whose size is within 1/SPARE_FIT of its length either way (a
# payload's size moves a little from step to step: a pickled skeleton, a grown optimizer state)
# and is resized to that size exactly (mremap: a shrink returns the tail's pages, a growth adds
# untouched ones), so what is reserved is what the buffer spans. Anything further off is left to
# a fresh buffer.
SPARE_FIT = 8


def _hash_executor() -> ThreadPoolExecutor:
    global _hash_pool
    if _hash_pool is None:
        _hash_pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="ftsup-sha256")
    return _hash_pool


class SnapshotMemoryFull(Exception):
    """Taking this snapshot would put the store over its memory limit; retryable once retention
    dropped older steps (the message names held, arriving, wanted and the limit)."""


@dataclass(frozen=True, slots=True)
class SnapshotId:
    generation: int
    rank: int
    step: int
    owner_node_id: str

    def describe(self) -> str:
        return f"snapshot of rank {self.rank} step {self.step} (generation {self.generation})"


@dataclass(frozen=True, slots=True)
class Blob:
    generation: int
    rank: int
    step: int
    owner_node_id: str
    payload: bytes | memoryview  # read-only; a view of the buffer it was received into
    sha256: str

    @property
    def key(self) -> tuple[int, int]:
        return (self.rank, self.step)

    @property
    def size_bytes(self) -> int:
        return len(self.payload)

    @property
    def ident(self) -> SnapshotId:
        return SnapshotId(self.generation, self.rank, self.step, self.owner_node_id)


def verify(blob: Blob) -> None:
    """Raises InvalidSnapshot unless the payload is non-empty and matches its hex SHA-256 (one pass;
    for blobs that did not arrive as a stream)."""
    what = blob.ident.describe()
    if not blob.payload:
        raise InvalidSnapshot(f"{what}: empty payload")
    claimed = check_sha256(what, blob.sha256)
    actual = hashlib.sha256(blob.payload).hexdigest()
    if actual != claimed:
        raise HashMismatch(f"{what}: sha256 mismatch (claimed {claimed}, payload has {actual})")


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Incoming:
    """A snapshot arriving: `add` each slice, then `finish` with the claimed SHA-256 (or `discard`).

    Ends exactly once; `on_end(self, blob_or_None)` tells the store. Single event loop, no locks.
    """

    def __init__(self, ident: SnapshotId, assembly: Assembly,
                 on_end: Callable[[Incoming, Blob | None], None] | None = None) -> None:
        self.ident = ident
        self._assembly = assembly
        self._on_end = on_end
        self._waiters: list[asyncio.Future[None]] = []
        self._hashing: asyncio.Future[None] | None = None  # the worker thread's hash_received, while it runs
        self.blob: Blob | None = None
        self.error: InvalidSnapshot | None = None

    @property
    def size_bytes(self) -> int:
        return self._assembly.size_bytes

    @property
    def received_bytes(self) -> int:
        return self._assembly.received_bytes

    @property
    def is_ended(self) -> bool:
        return self.blob is not None or self.error is not None

    def add(self, data: bytes | bytearray | memoryview) -> None:
        """The next slice; an InvalidSnapshot (too many bytes) discards the snapshot and is raised."""
        try:
            self._assembly.add(data)
        except InvalidSnapshot as exc:
            self.discard(exc)
            raise
        self._wake()
        self._hash_in_background(HASH_OFFLOAD_BYTES)

    async def hashed(self) -> None:
        """Until every byte received so far is hashed (by the worker; a small rest is left to
        `finish`). Call before `finish`, so that finishing never waits on the event loop."""
        while not self.is_ended:
            job = self._hashing
            if job is None:
                if not self._hash_in_background(HASH_OFFLOAD_BYTES):
                    return
            elif job.done():  # its done-callback may not have run yet
                self._hashing = None
                job.result()
            else:
                await asyncio.shield(job)

    def _hash_in_background(self, at_least: int) -> bool:
        """Starts the worker on the unhashed bytes when none runs and at least `at_least` wait;
        returns whether a worker is hashing now."""
        if self._hashing is not None:
            return True
        assembly = self._assembly
        if self.is_ended or assembly.received_bytes - assembly.hashed_bytes < max(at_least, 1):
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a synchronous caller): finish hashes it all
            return False
        self._hashing = loop.run_in_executor(_hash_executor(), assembly.hash_received)
        self._hashing.add_done_callback(self._hashed_some)
        return True

    def _hashed_some(self, done: asyncio.Future[None]) -> None:
        if self._hashing is not done:
            return  # `hashed` saw it end first
        self._hashing = None
        if not done.cancelled() and done.exception() is None:
            self._hash_in_background(HASH_OFFLOAD_BYTES)  # what landed meanwhile

    def finish(self, sha256_hex: str) -> Blob:
        """Verifies size and SHA-256 and hands the snapshot over (to the store, when it came from one);
        an InvalidSnapshot discards it and is raised. Hashes any bytes the worker has not (await
        `hashed` first to keep that off the event loop)."""
        try:
            payload = self._assembly.finish(sha256_hex)
        except InvalidSnapshot as exc:
            self.discard(exc)
            raise
        ident = self.ident
        self.blob = Blob(ident.generation, ident.rank, ident.step, ident.owner_node_id, payload, sha256_hex.lower())
        self._end()
        return self.blob

    def truncated(self) -> InvalidSnapshot:
        """Discards the snapshot as truncated (its stream ended early) and returns the error to raise."""
        error = self._assembly.truncated()
        self.discard(error)
        return error

    def discard(self, error: InvalidSnapshot) -> None:
        """Drops what arrived (idempotent; a finished snapshot stays finished)."""
        if self.is_ended:
            return
        self.error = error
        self._assembly.abandon()  # a worker still hashing stops at its next slice
        self._end()

    async def follow(self, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[tuple[memoryview, str]]:
        """The payload as it lands, in slices of at most `chunk_bytes` (views, no copy), as `cut`
        yields them: the last slice (possibly empty) carries the SHA-256 once `finish` verified it.
        Raises InvalidSnapshot when the snapshot is discarded meanwhile."""
        sent = 0
        while True:
            if self.error is not None:
                raise InvalidSnapshot(f"{self.ident.describe()} was discarded while forwarded: {self.error}")
            received = self._assembly.received_bytes
            if received - sent >= chunk_bytes or (self.blob is not None and received > sent):
                end = min(sent + chunk_bytes, received)
                piece = self._assembly.view(sent, end)
                sent = end
                is_last = self.blob is not None and sent == self.size_bytes
                yield piece, self.blob.sha256 if is_last and self.blob is not None else ""
                if is_last:
                    return
                continue
            if self.blob is not None:  # every byte went out before the last one was known
                yield memoryview(b""), self.blob.sha256
                return
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def _end(self) -> None:
        self._wake()
        if self._on_end is not None:
            self._on_end(self, self.blob)


class SnapshotStore:
    """In-memory snapshots. Single-threaded (one event loop), so no locking."""

    def __init__(self, keep_per_rank: int = KEEP_STEPS_PER_RANK, memory_limit_bytes: int = 0, *,
                 ram_bytes: int = 0, on_budget: Callable[[SnapshotBudget], None] | None = None) -> None:
        if memory_limit_bytes < 0:
            raise ValueError(f"memory_limit_bytes must be >= 0 (0: no explicit cap), got {memory_limit_bytes}")
        self._blobs: dict[tuple[int, int], Blob] = {}
        self._retain_from_step = 0
        self._keep_per_rank = keep_per_rank
        self._flag_bytes = memory_limit_bytes  # the operator's cap (--snapshot-memory-mib); 0: none
        self._ram_bytes = ram_bytes or physical_memory_bytes()
        self._expected: frozenset[int] = frozenset()  # own and buddy ranks of the current directive
        self._on_budget = on_budget  # told when the limit moves by a tenth or changes basis
        self.bytes_held = 0  # held blobs, and dropped ones a reader still streams (`pinned`)
        self.bytes_incoming = 0  # reserved by snapshots still arriving
        self._readers: dict[int, int] = {}  # id(blob) -> streams reading it now
        self._pinned: dict[int, Blob] = {}  # dropped while read: counted until the last reader lets go
        self._largest: dict[int, int] = {}  # rank -> its largest verified snapshot here (the job's sizes)
        self._buffers: dict[int, mmap.mmap] = {}  # id(blob) -> the buffer it was received into, while counted
        self._spares: dict[int, mmap.mmap] = {}  # rank -> a dropped snapshot's buffer, oldest first
        self.buffers_reused = 0  # snapshots received into a spare rather than a fresh buffer
        self.budget = self._budget()

    @property
    def memory_limit_bytes(self) -> int:
        """The limit on bytes held plus arriving, as of the sizes and ranks known now."""
        return self.budget.limit_bytes

    @property
    def cap_bytes(self) -> int:
        """What the limit can never exceed (half the RAM, or the flag): a larger snapshot never fits."""
        ram_cap = self._ram_bytes // 2
        return min(self._flag_bytes, ram_cap) if self._flag_bytes else ram_cap

    def expect_ranks(self, ranks: frozenset[int]) -> None:
        """The ranks the current directive makes this node hold snapshots of (its own, its buddies')."""
        self._expected = frozenset(ranks)
        for rank in [rank for rank in self._spares if rank not in self._expected]:
            del self._spares[rank]  # no snapshot of it is coming: its spare is only RAM held
        self._rebudget()

    def _budget(self, declared: tuple[int, int] | None = None) -> SnapshotBudget:
        largest, ranks = self._largest, set(self._expected) | {rank for rank, _ in self._blobs}
        if declared is not None:  # a snapshot being declared counts at its size
            rank, size = declared
            largest = {**largest, rank: max(largest.get(rank, 0), size)}
            ranks.add(rank)
        return snapshot_budget(largest, ranks, keep_per_rank=self._keep_per_rank, ram_bytes=self._ram_bytes,
                               flag_bytes=self._flag_bytes)

    def _rebudget(self) -> None:
        old, self.budget = self.budget, self._budget()
        self._make_room(0, self.budget.limit_bytes)  # a lower limit leaves less room for spares
        moved = abs(self.budget.limit_bytes - old.limit_bytes) * 10 >= old.limit_bytes
        if self._on_budget is not None and (moved or self.budget.basis is not old.basis):
            self._on_budget(self.budget)

    def __len__(self) -> int:
        return len(self._blobs)

    def receive(self, ident: SnapshotId, size_bytes: int) -> Incoming:
        """Reserves `size_bytes` for a snapshot about to arrive; it enters the store when finished.

        Raises InvalidSnapshot for an empty payload (no snapshot is empty) or OversizedStream for a
        size beyond the limit itself, SnapshotMemoryFull when the limit has no room for it now (spares
        never stand in the way: they are released first). The bytes land in a fitting spare when
        there is one, else in a fresh buffer.
        """
        if size_bytes == 0:
            raise InvalidSnapshot(f"{ident.describe()}: empty payload")
        largest = self._largest.get(ident.rank, 0)
        if largest and size_bytes > SIZE_GROWTH_LIMIT * largest:
            raise OversizedStream(
                f"{ident.describe()}: declared size {size_bytes} bytes is over {SIZE_GROWTH_LIMIT}x the largest "
                f"snapshot of rank {ident.rank} held here ({largest} bytes): a rank's state does not grow so fast"
            )
        what = ident.describe()
        check_declared_size(what, size_bytes, self.cap_bytes)
        in_use = self.bytes_held + self.bytes_incoming
        budget = self._budget((ident.rank, size_bytes))
        if in_use + size_bytes > budget.limit_bytes:
            raise SnapshotMemoryFull(
                f"{what}: {size_bytes} bytes do not fit: {self.bytes_held} bytes held + "
                f"{self.bytes_incoming} arriving + {size_bytes} > the limit of {budget.limit_bytes} bytes "
                f"({budget.reason})"
            )
        buffer = self._take_spare(ident.rank, size_bytes)
        if buffer is None:
            fresh = lazy_buffer(size_bytes)
            assert isinstance(fresh, mmap.mmap)  # size_bytes > 0
            buffer = fresh
        else:
            self.buffers_reused += 1
        assembly = Assembly(what, size_bytes, self.cap_bytes, hash_later=True, buffer=buffer)
        self.bytes_incoming += size_bytes
        self._make_room(0, budget.limit_bytes)  # the spares left, beside what is held and arriving now
        return Incoming(ident, assembly, functools.partial(self._ended, buffer))

    def _ended(self, buffer: mmap.mmap, incoming: Incoming, blob: Blob | None) -> None:
        self.bytes_incoming -= incoming.size_bytes
        if blob is None:  # discarded: what arrived is never read again, the buffer can take the next one
            if incoming.ident.rank not in self._spares:  # (a follower's slice may still view this
                self._keep_spare(incoming.ident.rank, buffer)  # one: a spare kept already goes first)
            return
        self._buffers[id(blob)] = buffer
        self._put_verified(blob)

    @property
    def bytes_spare(self) -> int:
        """Bytes of spare receive buffers: resident RAM, counted against the limit with the rest."""
        return sum(len(buffer) for buffer in self._spares.values())

    def _take_spare(self, rank: int, size_bytes: int) -> mmap.mmap | None:
        """A spare that fits `size_bytes` (`SPARE_FIT`; the rank's own first), out of the pool and
        resized to exactly that; None when there is none.

        A buffer is taken only when nothing exports a view of it: a Blob's payload, a follower's or
        a fetch's slice, the old Assembly (while it lives) are all views, and a mapping refuses to
        resize while one exists (BufferError), so a reader can never see its bytes change under it.
        A spare still viewed stays where it is (its RAM is in use either way)."""
        for owner in sorted(self._spares, key=lambda r: r != rank):
            buffer = self._spares[owner]
            if abs(len(buffer) - size_bytes) * SPARE_FIT > size_bytes:
                continue
            try:
                buffer.resize(size_bytes)
            except BufferError:  # someone may still read it: not ours to write into
                continue
            except (OSError, ValueError, TypeError, SystemError):  # this platform cannot resize it
                del self._spares[owner]
                continue
            del self._spares[owner]
            return buffer
        return None

    def _keep_spare(self, rank: int, buffer: mmap.mmap) -> None:
        """Keeps `buffer` as `rank`'s spare (replacing an older one), room permitting."""
        self._spares.pop(rank, None)
        self._spares[rank] = buffer
        self._make_room(0, self.budget.limit_bytes)

    def _make_room(self, wanted: int, limit_bytes: int) -> None:
        """Releases spares, oldest first, until `wanted` more bytes fit under `limit_bytes` with them."""
        while self._spares and self.bytes_held + self.bytes_incoming + self.bytes_spare + wanted > limit_bytes:
            del self._spares[next(iter(self._spares))]

    def _retire(self, blob: Blob) -> None:
        """`blob` is no longer counted: the buffer it was received into (if any) becomes its rank's spare."""
        buffer = self._buffers.pop(id(blob), None)
        if buffer is not None:
            self._keep_spare(blob.rank, buffer)

    def put(self, blob: Blob) -> None:
        """Stores a blob that did not arrive as a stream, after verifying it (replacing one at the
        same key), then applies retention."""
        verify(blob)
        self._put_verified(blob)

    def _put_verified(self, blob: Blob) -> None:
        old = self._blobs.pop(blob.key, None)
        if old is not None:
            self._let_go(old)
        self._blobs[blob.key] = blob
        self.bytes_held += blob.size_bytes
        self._largest[blob.rank] = max(self._largest.get(blob.rank, 0), blob.size_bytes)
        self._prune()
        self._rebudget()

    def get(self, rank: int, step: int) -> Blob | None:
        return self._blobs.get((rank, step))

    @contextlib.contextmanager
    def reading(self, rank: int, step: int) -> Iterator[Blob | None]:
        """The held (rank, step) blob, pinned (`pin`) while the caller streams it out; None when not held."""
        blob = self._blobs.get((rank, step))
        if blob is None:
            yield None
            return
        with self.pin(blob):
            yield blob

    @contextlib.contextmanager
    def pin(self, blob: Blob) -> Iterator[Blob]:
        """Counts `blob` against the limit while a stream sends it out, even if retention drops it
        meanwhile (the stream still holds its bytes), so the limit bounds what RAM really holds.
        A blob this store does not hold (anymore) is not counted: it was never (or is no longer) its."""
        key = id(blob)
        if self._blobs.get(blob.key) is not blob and key not in self._pinned:
            yield blob
            return
        self._readers[key] = self._readers.get(key, 0) + 1
        try:
            yield blob
        finally:
            left = self._readers.pop(key) - 1
            if left:
                self._readers[key] = left
            elif self._pinned.pop(key, None) is not None:
                self.bytes_held -= blob.size_bytes
                self._retire(blob)

    @property
    def bytes_pinned(self) -> int:
        """Bytes of dropped blobs that readers still stream (part of `bytes_held`)."""
        return sum(blob.size_bytes for blob in self._pinned.values())

    def _let_go(self, blob: Blob) -> None:
        if self._readers.get(id(blob)):
            self._pinned[id(blob)] = blob
        else:
            self.bytes_held -= blob.size_bytes
            self._retire(blob)

    def keys(self) -> list[tuple[int, int]]:
        return sorted(self._blobs)

    def set_retain_from_step(self, step: int) -> None:
        # Taken as given, not max()ed: after a rollback to an older step the floor moves down, and
        # stale directives never get here (the launcher ignores older generations).
        self._retain_from_step = step
        self._prune()
        self._rebudget()

    def _prune(self) -> None:
        for key in keys_to_drop(self._blobs, self._retain_from_step, self._keep_per_rank):
            self._let_go(self._blobs.pop(key))
