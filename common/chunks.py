"""Snapshot payloads cut into chunks and put back together: the framing every snapshot hop shares.

A snapshot travels as a stream of chunks (peer.proto `SnapshotChunk`): the first declares the
payload's size, each carries the next slice in order, the last carries the hex SHA-256 of the
whole payload. `cut` slices a payload and hashes it as it goes; `Assembly` writes slices into one
lazily committed buffer (an anonymous mapping of the declared size: the OS commits a page only
when a slice lands on it, so a header alone costs no RAM) and hashes each as it lands, so neither
side makes a second pass over the payload or a second copy of it. The rule it enforces: a payload is handed out
only once exactly the declared bytes arrived and their SHA-256 matches; anything else raises an
`InvalidSnapshot` naming what was wrong, and the caller drops the buffer (nothing half-received is
ever visible). An `Assembly` made with `hash_later` leaves the hashing to `hash_received`, which a
worker thread runs while more bytes land (hashlib lets go of the GIL on large buffers), so a
receiver's event loop only copies; `finish` hashes whatever is left first, so no byte is ever
skipped. `cut_parts` slices a payload kept in several buffers (trainer/snapshot.py's raw format)
without joining them. Pure (hashlib only): the trainer, both agent services and the peer client use it.
"""

from __future__ import annotations

import hashlib
import mmap
import re
import threading
from collections.abc import Iterator, Sequence

CHUNK_BYTES = 4 * 1024 * 1024  # per message: well under the endpoints' limit, big enough to amortise a call
HASH_SLICE_BYTES = 16 * 1024 * 1024  # hash_received's step: how soon an abandoned assembly's hashing stops
STREAM_BASE_S = 60.0  # a stream's deadline: this much, plus its size at the slowest rate we still call working
STREAM_MIN_BYTES_PER_S = 8 * 1024 * 1024
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class InvalidSnapshot(ValueError):
    """A snapshot (or its stream) is malformed; not retryable: the sender must send it again whole."""


class TruncatedStream(InvalidSnapshot):
    """The stream ended without its last chunk (the one carrying the SHA-256): the sender stopped."""


class OversizedStream(InvalidSnapshot):
    """The stream carried (or declared) more bytes than it may: beyond its own declared size or a limit."""


class SizeMismatch(InvalidSnapshot):
    """The stream was closed (its SHA-256 came) with fewer bytes than its header declared."""


class HashMismatch(InvalidSnapshot):
    """The bytes received do not hash to the SHA-256 the sender claimed (or it is not 64 hex digits)."""


def spans(size_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """The (start, end) of each chunk of a `size_bytes` payload; an empty payload is one empty chunk,
    so every stream has a first and a last message."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    if size_bytes == 0:
        return [(0, 0)]
    return [(start, min(start + chunk_bytes, size_bytes)) for start in range(0, size_bytes, chunk_bytes)]


def stream_deadline_s(size_bytes: int) -> float:
    """How long a stream of `size_bytes` may take end to end before it counts as stalled."""
    return STREAM_BASE_S + size_bytes / STREAM_MIN_BYTES_PER_S


def cut(payload: bytes | bytearray | memoryview, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[memoryview, str]]:
    """Yields (slice, sha256) per chunk: slices are views (no copy); sha256 is "" except on the last
    chunk, which carries the hex SHA-256 of the whole payload, computed while cutting."""
    view = memoryview(payload).cast("B")
    digest = hashlib.sha256()
    bounds = spans(len(view), chunk_bytes)
    for index, (start, end) in enumerate(bounds):
        piece = view[start:end]
        digest.update(piece)
        yield piece, digest.hexdigest() if index == len(bounds) - 1 else ""


def cut_parts(parts: Sequence[bytes | bytearray | memoryview],
              chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[memoryview, ...]]:
    """The payload that `parts` make back to back, as `spans` cuts it: per chunk the views (no
    copy) of the parts it covers, in order; empty parts are left out (an empty payload is one chunk
    of no views)."""
    views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]
    total = sum(len(v) for v in views)
    index, offset = 0, 0  # the next byte: views[index][offset]
    for start, end in spans(total, chunk_bytes):
        pieces: list[memoryview] = []
        wanted = end - start
        while wanted:
            view = views[index]
            take = min(wanted, len(view) - offset)
            pieces.append(view[offset:offset + take])
            wanted -= take
            offset += take
            if offset == len(view):
                index, offset = index + 1, 0
        yield tuple(pieces)


def check_sha256(what: str, claimed: str) -> str:
    """The claimed hex digest, lower-cased; HashMismatch unless it is 64 hex digits."""
    lowered = claimed.lower()
    if not SHA256_HEX.fullmatch(lowered):
        raise HashMismatch(f"{what}: sha256 {claimed!r} is not 64 hex digits")
    return lowered


def lazy_buffer(size_bytes: int) -> mmap.mmap | bytearray:
    """A writable buffer of `size_bytes` whose memory is committed only as it is written.

    An anonymous private mapping: its pages are zero-fill-on-demand, so resident memory follows
    the bytes that arrived, never the size a header declared (`bytearray(n)` zero-fills, which
    commits every page at once). Unlike a list of chunks joined at the end there is no second
    copy at the finish, and views of received bytes stay valid as more arrive (nothing moves).
    """
    if size_bytes == 0:
        return bytearray()  # a mapping cannot be empty
    return mmap.mmap(-1, size_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def check_declared_size(what: str, size_bytes: int, max_bytes: int) -> None:
    """SizeMismatch for a negative declared size, OversizedStream for one over `max_bytes`: checked
    before a buffer is allocated (or a reused one taken) for it."""
    if size_bytes < 0:
        raise SizeMismatch(f"{what}: declared size {size_bytes} is negative")
    if size_bytes > max_bytes:
        raise OversizedStream(f"{what}: declared size {size_bytes} bytes is over the limit of {max_bytes} bytes")


class Assembly:
    """One payload being received: slices land in a buffer of the declared size, hashed on arrival.

    `what` names the snapshot in every error. `max_bytes` bounds the declared size (checked before
    anything is allocated). `buffer`, when given, is a mapping of exactly the declared size to
    receive into instead of a fresh one (the snapshot store reuses a dropped snapshot's: its pages
    are resident already, so the copy in takes no page faults). It still holds the old bytes: only
    [0, received_bytes) is ever read (`view`, the hashing), and `finish` wants every declared byte
    received and hashed, so none of them can reach a payload. Not thread-safe; one receiver
    writes, followers read `view(start, end)` of the bytes already received.
    """

    def __init__(self, what: str, size_bytes: int, max_bytes: int, *, hash_later: bool = False,
                 buffer: mmap.mmap | None = None) -> None:
        check_declared_size(what, size_bytes, max_bytes)
        if buffer is not None and len(buffer) != size_bytes:
            raise ValueError(f"{what}: a buffer of {len(buffer)} bytes for a payload of {size_bytes}")
        self.what = what
        self.size_bytes = size_bytes
        self.received_bytes = 0
        self.hashed_bytes = 0  # [0, hashed_bytes) went into the digest, in order
        self._buffer = lazy_buffer(size_bytes) if buffer is None else buffer
        self._view = memoryview(self._buffer)
        self._digest = hashlib.sha256()
        self._hash_later = hash_later  # add() leaves the hashing to hash_received (a worker thread)
        self._hashing = threading.Lock()  # one hash_received at a time: the digest sees the bytes in order
        self._abandoned = False
        self._done = False

    @property
    def is_done(self) -> bool:
        return self._done

    def add(self, data: bytes | bytearray | memoryview) -> None:
        """Appends the next slice; OversizedStream when it runs past the declared size."""
        if self._abandoned:
            raise InvalidSnapshot(f"{self.what}: {len(data)} bytes arrived after the payload was abandoned")
        if self._done:
            raise OversizedStream(f"{self.what}: {len(data)} bytes arrived after the end of the stream")
        end = self.received_bytes + len(data)
        if end > self.size_bytes:
            raise OversizedStream(
                f"{self.what}: stream carries more than the declared {self.size_bytes} bytes "
                f"({end} bytes so far)"
            )
        self._view[self.received_bytes:end] = data
        if not self._hash_later:
            with self._hashing:
                self._digest.update(data)
                self.hashed_bytes = end
        self.received_bytes = end

    def hash_received(self) -> None:
        """Hashes the bytes received and not hashed yet, in order; safe from any thread while the
        receiver adds more (only bytes already received are read, and they never change). Stops
        early once `abandon` was called."""
        with self._hashing:
            end = self.received_bytes
            while self.hashed_bytes < end and not self._abandoned:
                stop = min(end, self.hashed_bytes + HASH_SLICE_BYTES)
                self._digest.update(self._view[self.hashed_bytes:stop])
                self.hashed_bytes = stop
        if self._abandoned:  # abandoned while this ran, which left the buffer to this thread
            self._let_go_if_idle()

    def abandon(self) -> None:
        """The payload will not be finished: a `hash_received` under way stops at its next slice,
        and the buffer is let go at once (by that worker when one runs), not when this object dies.

        Letting go releases this Assembly's view of the buffer, the export that keeps a mapping
        from being resized: a store may then take it for the next snapshot at once. Otherwise it
        waits for the Assembly to be freed, and a raised error's traceback holding its receiver's
        frame makes that a cycle, freed only at a full garbage collection, RAM uncounted meanwhile.
        A slice someone still reads (a follower's) keeps its own export: the buffer stays unusable
        until that slice is released, so nobody ever sees its bytes change.
        """
        self._abandoned = True
        self._let_go_if_idle()

    def _let_go_if_idle(self) -> None:
        """Releases the view unless a `hash_received` holds it now: that one checks again once it
        is out (the flag is set first, so whoever holds the lock last lets go)."""
        if not self._hashing.acquire(blocking=False):
            return
        try:
            self._view.release()
        except BufferError:  # exported by the view itself (not by a slice): it goes with this object
            pass
        finally:
            self._hashing.release()

    def truncated(self) -> TruncatedStream:
        """The error for a stream that ended before its last chunk (cleanly or by the sender's death)."""
        return TruncatedStream(
            f"{self.what}: stream ended after {self.received_bytes} of the declared {self.size_bytes} bytes, "
            "without its last chunk (the one carrying the sha256)"
        )

    def view(self, start: int, end: int) -> memoryview:
        """Read-only view of received bytes [start, end); never beyond what arrived (nor any once
        the payload was abandoned: InvalidSnapshot)."""
        if self._abandoned:
            raise InvalidSnapshot(f"{self.what}: the payload was abandoned")
        if not 0 <= start <= end <= self.received_bytes:
            raise ValueError(f"{self.what}: bytes [{start}, {end}) are not received yet ({self.received_bytes})")
        return self._view[start:end].toreadonly()

    def finish(self, sha256_hex: str) -> memoryview:
        """The whole payload (a read-only view of the buffer, no copy), once verified.

        SizeMismatch when bytes are missing, HashMismatch when they do not hash to `sha256_hex`.
        """
        if self._done:
            raise InvalidSnapshot(f"{self.what}: the stream was already finished")
        if self.received_bytes < self.size_bytes:
            raise SizeMismatch(
                f"{self.what}: stream closed after {self.received_bytes} of the declared {self.size_bytes} bytes"
            )
        claimed = check_sha256(self.what, sha256_hex)
        if self._abandoned:
            raise InvalidSnapshot(f"{self.what}: the stream was abandoned")
        self.hash_received()  # whatever the worker has not hashed yet (all of it without one)
        if self.hashed_bytes != self.size_bytes:
            raise InvalidSnapshot(f"{self.what}: {self.hashed_bytes} of {self.size_bytes} bytes hashed")
        actual = self._digest.hexdigest()
        if actual != claimed:
            raise HashMismatch(f"{self.what}: sha256 mismatch (claimed {claimed}, payload has {actual})")
        self._done = True
        return self._view.toreadonly()
