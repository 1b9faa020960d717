"""EventLog on etcd: the replicated backend. Owns the keys under `<prefix>/` and a hot copy of them.

Keys: `<prefix>/log/<seq:020d>` (one Record proto each; or, for an append of more records than one
transaction has operations for, one span value holding them all under its last seq: etcd_spans.py),
`<prefix>/head` (the last seq, decimal), `<prefix>/log.compacted` (the seq compaction dropped
through: a span it cut into keeps its key, and readers skip its covered records),
`<prefix>/snapshot` and `<prefix>/snapshot.prev` (the two retained ClusterState protos), and
`<prefix>/blob/<sha256>/<n>`: values too large for one etcd request (a 12,500-node snapshot or
GenerationStarted) are chunked there and the record or snapshot key holds a small pointer written
last (etcd_blobs.py); reads are paged at one revision, under the client's 4 MiB response limit.
After each snapshot, compact() drops the records and blobs it covers, collects orphaned blobs (an
append or snapshot that failed or crashed after its chunks were written, a compaction cut short
before its blobs went) and compacts etcd's revision history to the previous snapshot's revision
(docs/ops.md: quota and defragmentation). Collection is safe against writers in flight: it deletes
only in a transaction comparing that no pointer was committed since it looked (head and snapshot
mod revisions unchanged), and every transaction that commits a pointer compares that the pointed
chunks exist, rewriting them and retrying if a collection took them first.
Every append, of any size, is ONE transaction comparing the head (gapless seqs, the contract's
expect_seq) and, when the log is fenced, that the leader key's create revision still equals the
writer's term: a deposed or paused leader's append fails with `Deposed` (DESIGN.md "a deposed
leader cannot append"). A decision is never split over transactions (a half-committed one, say
deaths without their GenerationEnded, is a state no later leader repairs): an append of more
records than --max-txn-ops leaves room for is one span value (plus the head), whatever its size.
Concurrent appends from this process are group-committed: several appends, one transaction.
Reads are served from the hot copy kept by a watch (re-watched from last revision + 1 after a
broken stream, so it is gap-free), so read()/load_snapshot() stay synchronous like the other
backends. Every etcd call has a deadline; failing it means LogUnavailable (retryable), and for an
append the outcome is then unknown: call sync() and look before re-deciding.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions
from aetcd import transactions as tx

from ftsup.common.deadline import within
from ftsup.supervisor import codec
from ftsup.supervisor.core.events import Event, Record
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.api import Deposed, Fenced, LogCompacted, LogError, LogUnavailable
from ftsup.supervisor.eventlog.etcd_blobs import (
    DEFAULT_CHUNK_BYTES,
    RESPONSE_BUDGET_BYTES,
    Pointer,
    blob_directory,
    chunk_key,
    decode_pointer,
    is_pointer,
    prefix_end,
    range_page,
    split,
)
from ftsup.supervisor.eventlog.etcd_spans import SpanFormatError, decode_span, encode_span, is_span
from ftsup.v1 import events_pb2, state_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_OP_TIMEOUT_S = 2.0
DEFAULT_MAX_TXN_OPS = 128  # etcd's --max-txn-ops default
DEFAULT_MAX_TXN_BYTES = 1024 * 1024  # inline values per transaction, under etcd's 1.5 MiB request limit
DEFAULT_PAGE_KEYS = 1000
_WATCH_BACKOFF_S = (0.05, 1.0)
_BLOB_RETRIES = 3  # commits of one append whose chunks a collection deleted first, before LogUnavailable


def client_target(endpoints: Sequence[str]) -> tuple[str, int]:
    """('127.0.0.1:2379', '127.0.0.1:2380', ...) -> aetcd's multi-address (host, port).

    gRPC's `ipv4:a:p1,b:p2,c` target with the last port passed separately (DEPENDENCIES.md);
    the channel picks the first reachable address and fails over to the next.
    """
    if not endpoints:
        raise ValueError("at least one etcd endpoint is needed")
    parsed = []
    for endpoint in endpoints:
        bare = endpoint.removeprefix("http://")
        host, sep, port = bare.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"etcd endpoint {endpoint!r} is not host:port")
        parsed.append((host, int(port)))
    *head, (last_host, last_port) = parsed
    return "ipv4:" + ",".join([f"{h}:{p}" for h, p in head] + [last_host]), last_port


def make_client(endpoints: Sequence[str], *, timeout_s: float = DEFAULT_OP_TIMEOUT_S) -> aetcd.Client:
    """An aetcd client over all endpoints with a per-call gRPC deadline.

    gRPC keepalive pings detect a silent (paused) member; etcd refuses pings more often than its
    --grpc-keepalive-min-time (5 s), so 5 s is as fast as we may go.
    """
    host, port = client_target(endpoints)
    options = {
        "grpc.keepalive_time_ms": 5000,
        "grpc.keepalive_timeout_ms": 2000,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.initial_reconnect_backoff_ms": 50,
        "grpc.max_reconnect_backoff_ms": 1000,
    }
    return aetcd.Client(host=host, port=port, timeout=timeout_s, options=options)


def _is_unavailable(exc: BaseException) -> bool:
    bad_request = (aetcd.exceptions.InvalidArgumentError, aetcd.exceptions.UnauthenticatedError)
    return isinstance(exc, (aetcd.exceptions.ClientError, TimeoutError)) and not isinstance(exc, bad_request)


@dataclass(slots=True)
class _Pending:
    events: Sequence[Event]
    term: int
    time_unix_s: float
    expect_seq: int | None
    done: asyncio.Future[list[Record]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    blob_retries: int = 0  # commits refused because a collection took this append's chunks first


@dataclass
class _Flight:
    """The `log/<seq>` keys of the transaction in flight. The writer's watch sees them come back,
    often before the transaction's own answer: it waits for that answer rather than read and
    decode them again (a 12,500-node GenerationStarted: ~1.4 s of the leader's loop), and reads
    them only if the commit did not take them in (another writer's keys, or an answer lost)."""

    keys: frozenset[bytes]
    landed: asyncio.Event = field(default_factory=asyncio.Event)
    absorbed: bool = False


class EtcdLog:
    """Open with `await EtcdLog.open(client, prefix, fence_key=...)`; see the module docstring."""

    def __init__(
        self,
        client: aetcd.Client,
        prefix: str,
        *,
        fence_key: str | None = None,
        op_timeout_s: float = DEFAULT_OP_TIMEOUT_S,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_txn_bytes: int = DEFAULT_MAX_TXN_BYTES,
        page_keys: int = DEFAULT_PAGE_KEYS,
        compact_history: bool = True,
    ) -> None:
        if not prefix or prefix.endswith("/"):
            raise ValueError(f"etcd log prefix {prefix!r} must be non-empty without a trailing '/'")
        if op_timeout_s <= 0:
            raise ValueError(f"op_timeout_s must be > 0, got {op_timeout_s}")
        if max_txn_ops < 3:
            raise ValueError(f"max_txn_ops must be >= 3 (records + head), got {max_txn_ops}")
        if not 1024 <= chunk_bytes <= max_txn_bytes:
            raise ValueError(f"chunk_bytes must be in [1024, max_txn_bytes={max_txn_bytes}], got {chunk_bytes}")
        if page_keys < 1:
            raise ValueError(f"page_keys must be >= 1, got {page_keys}")
        self._client = client
        self.prefix = prefix
        self._root = f"{prefix}/".encode()
        self._log_prefix = f"{prefix}/log/".encode()
        self._blob_prefix = f"{prefix}/blob/".encode()
        self._head_key = f"{prefix}/head".encode()
        self._floor_key = f"{prefix}/log.compacted".encode()  # sorts between head and log/
        self._snap_key = f"{prefix}/snapshot".encode()
        self._prev_key = f"{prefix}/snapshot.prev".encode()
        self._fence_key = fence_key.encode() if fence_key else None
        self._timeout_s = op_timeout_s
        self._max_records = max_txn_ops - 1  # one op is the head; more records than this: a span
        self._chunk_bytes = chunk_bytes
        self._max_txn_bytes = max_txn_bytes
        self._page_keys = page_keys
        self._compacts_history = compact_history
        self._record_blobs: dict[int, str] = {}  # seq -> blob of a record stored out of line
        self._blob_suspects: dict[str, int] = {}  # unreferenced at the last collection: sha -> newest chunk revision
        self.blobs_collected = 0  # orphaned blobs deleted by collect_garbage, since open
        self._prev_raw = b""  # what snapshot.prev holds (a pointer for a chunked snapshot)
        self._prev_rev = 0  # mod revision of snapshot.prev
        self._history_floor = 0  # revision at which the older retained snapshot was written (0: unknown)
        self.compacted_revision = 0  # the last etcd revision this log compacted history to
        # The hot copy: contiguous records [_first, head]; later ones wait in _ahead.
        self._records: list[Record] = []
        self._first = 1
        self._ahead: dict[int, Record] = {}
        self._write_head = 0  # the head etcd held when we last knew it (== hot copy head normally)
        self._snapshot: ClusterState | None = None
        self._snapshot_raw = b""
        self._snapshot_rev = 0
        self._prev: ClusterState | None = None
        self._revision = 0  # last etcd revision folded into the hot copy
        self._changed = asyncio.Event()
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._flight: _Flight | None = None  # the keys of the commit in flight (one at a time)
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False
        self.watch_restarts = 0  # how often the watch stream broke and was re-established

    # -- opening and the hot copy ----------------------------------------------------------
    @classmethod
    async def open(cls, client: aetcd.Client, prefix: str, **kwargs: Any) -> EtcdLog:
        self = cls(client, prefix, **kwargs)
        await self.sync()
        self._watcher = asyncio.create_task(self._watch(), name=f"etcdlog-watch {prefix}")
        return self

    async def sync(self) -> None:
        """Reloads everything under the prefix (a linearizable read): after LogUnavailable, after
        a compacted watch revision, or to be sure the hot copy includes every acknowledged append.
        Paged at one revision; restarted if etcd compacts that revision away meanwhile."""
        for attempt in range(3):
            try:
                await self._sync_once()
                return
            except LogUnavailable as exc:
                if attempt == 2 or not isinstance(exc.__cause__, aetcd.exceptions.RevisionCompactedError):
                    raise

    async def _sync_once(self) -> None:
        head, floor, records, revision = 0, 0, [], 0
        # Everything after `blob/` (chunks are read through the pointers that reference them).
        async for kv, revision in self._read_range(self._head_key, prefix_end(self._root)):
            value = await self._resolve(kv.value, revision)
            if kv.key.startswith(self._log_prefix):
                records.extend(self._records_of(kv.key, value, kv.value))
            elif kv.key == self._head_key:
                head = int(value)
            elif kv.key == self._floor_key:
                floor = int(value)
            else:
                self._absorb_kv(kv.key, value, kv.mod_revision, kv.value)
        if not revision:
            revision = await self._revision_while_empty()
        self._absorb_records(records, head)
        self._drop_through(floor)  # a span cut by a compaction still holds records it covered
        self._revision = max(self._revision, revision)
        self._notify()

    async def _revision_while_empty(self) -> int:
        """The etcd revision at which nothing is under the prefix (0 if a key came meanwhile: the
        watch from revision 1 then finds it, unless compacted, and reloads). A new log's watch
        started at revision 1, which fails once etcd has compacted its history, and reloaded
        until the first key appeared, a warning a second."""
        page = await self._call(
            range_page(self._client, self._head_key, prefix_end(self._root), limit=1, keys_only=True)
        )
        return 0 if page.kvs else int(page.header.revision)

    async def _read_range(
        self, start: bytes, end: bytes, revision: int = 0, *, keys_only: bool = False
    ) -> AsyncIterator[tuple[Any, int]]:
        """(kv, revision) for every key in [start, end) at one revision (0: now), a page per call.
        A page shrinks when its response would pass the client's message limit (large values)."""
        limit = self._page_keys
        while True:
            try:
                page = await self._call(
                    range_page(self._client, start, end, limit=limit, revision=revision, keys_only=keys_only)
                )
            except LogUnavailable as exc:
                if limit > 1 and "larger than max" in str(exc):
                    limit = max(1, limit // 8)
                    continue
                raise
            revision = revision or page.header.revision
            for kv in page.kvs:
                yield kv, revision
            if not page.more or not page.kvs:
                return
            start = page.kvs[-1].key + b"\0"

    async def _resolve(self, stored: bytes, revision: int) -> bytes:
        """The value itself: `stored`, or the chunks its pointer names, read at `revision`."""
        if not is_pointer(stored):
            return stored
        pointer = decode_pointer(stored)
        directory = blob_directory(self._root, pointer.sha256)
        limit = max(1, RESPONSE_BUDGET_BYTES // self._chunk_bytes)
        parts: list[bytes] = []
        while True:  # pages by hand: _read_range's page size is for small values
            page = await self._call(
                range_page(self._client, directory, prefix_end(directory), limit=limit, revision=revision)
            )
            parts.extend(kv.value for kv in page.kvs)
            if not page.more or not page.kvs:
                break
            directory = page.kvs[-1].key + b"\0"
        value = b"".join(parts)
        if len(parts) != pointer.chunks or hashlib.sha256(value).hexdigest() != pointer.sha256:
            raise LogError(
                f"etcd log {self.prefix}: blob {pointer.sha256} at revision {revision} has {len(parts)} of"
                f" {pointer.chunks} chunks ({len(value)} of {pointer.size} bytes) or another SHA-256"
            )
        return value

    async def _store_blob(self, value: bytes) -> Pointer:
        """Writes `value`'s chunks, one request each (content-addressed: a retry rewrites the same)."""
        pointer, chunks = split(value, self._chunk_bytes)
        for index, chunk in enumerate(chunks):
            await self._call(self._client.put(chunk_key(self._root, pointer.sha256, index), chunk))
        return pointer

    async def _delete_blob(self, sha256: str) -> None:
        directory = blob_directory(self._root, sha256)
        await self._call(self._client.delete_range(directory, prefix_end(directory)))

    async def _watch(self) -> None:
        delay = _WATCH_BACKOFF_S[0]
        me = asyncio.current_task()
        # aetcd swallows a CancelledError in places (watcher shutdown): check we were not cancelled.
        while not self._closed and not (me is not None and me.cancelling()):
            try:
                watch = await within(
                    self._client.watch_prefix(self._root, start_revision=self._revision + 1), self._timeout_s
                )
                try:
                    if self._closed or (me is not None and me.cancelling()):
                        return  # Python 3.11's wait_for can swallow a cancel that raced its result
                    async for event in watch:
                        delay = _WATCH_BACKOFF_S[0]
                        kv = event.kv
                        if event.kind == "DELETE":
                            self._absorb_delete(kv.key)
                        elif await self._absorbed_already(kv.key):
                            pass  # our own append, back: its commit took its records in
                        elif not kv.key.startswith(self._blob_prefix):  # chunks: read via pointers
                            value = await self._resolve(kv.value, kv.mod_revision)
                            self._absorb_kv(kv.key, value, kv.mod_revision, kv.value)
                        # aetcd delivers a whole watch response (one revision) before any stream
                        # error, so resuming at revision + 1 neither skips nor repeats a revision.
                        self._revision = max(self._revision, kv.mod_revision)
                        self._notify()
                        if self._closed:
                            return  # closed while this event was handled: its cancel may have been
                            # swallowed by a wait_for whose call finished at that moment (Python 3.11)
                finally:
                    with contextlib.suppress(Exception):
                        await within(watch.cancel(), self._timeout_s)
            except asyncio.CancelledError:
                raise
            except (aetcd.exceptions.RevisionCompactedError, LogError) as exc:
                # Compacted past our revision (a long disconnection), or a blob that could not be
                # read at its revision: reload everything at one revision, then watch on from there.
                log.warning("etcd watch on %s cannot go on from revision %d (%r); reloading", self.prefix,
                            self._revision, exc)
                with contextlib.suppress(LogError):
                    await self.sync()
            except Exception as exc:  # a broken stream: re-watch from the last revision + 1
                log.info("etcd watch on %s broke (%r); re-watching from %d", self.prefix, exc, self._revision + 1)
            if self._closed or (me is not None and me.cancelling()):
                return
            self.watch_restarts += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, _WATCH_BACKOFF_S[1])

    async def _absorbed_already(self, key: bytes) -> bool:
        """Whether the `log/<seq>` key a watch event names holds records this copy took in (or
        will: a commit in flight wrote it). Keys are written once, by the transaction that moves
        the head past them, so a held seq is the same record. Waits for a commit in flight to be
        answered (at most the call's deadline); its keys are then held, or read as anyone's."""
        if not key.startswith(self._log_prefix):
            return False
        flight = self._flight
        if flight is not None and key in flight.keys:
            await flight.landed.wait()
            return flight.absorbed
        return int(key[len(self._log_prefix) :]) <= self.head_seq

    def _records_of(self, key: bytes, value: bytes, stored: bytes) -> list[Record]:
        """The records a `log/<seq>` key holds: one, or a span ending at <seq>. `value` is
        resolved (a pointer's chunks joined), `stored` what the key holds; a pointer's blob is
        remembered under the key's seq, which is when a compaction deletes the key and the blob."""
        seq = int(key[len(self._log_prefix) :])
        try:
            if is_span(value):
                first, raws = decode_span(value)
                records = [codec.record_from_proto(events_pb2.Record.FromString(raw)) for raw in raws]
                if [r.seq for r in records] != list(range(first, first + len(records))) or first + len(
                    records
                ) - 1 != seq:
                    raise SpanFormatError(
                        f"its {len(records)} records from seq {first} are not seqs {first}..{seq}"
                    )
            else:
                records = [codec.record_from_proto(events_pb2.Record.FromString(value))]
        except ValueError as exc:  # SpanFormatError, protobuf's DecodeError, a bad enum
            raise LogError(f"etcd log {self.prefix}: key {key.decode(errors='replace')} does not hold"
                           f" records: {exc}") from exc
        if is_pointer(stored):
            self._record_blobs[seq] = decode_pointer(stored).sha256
        return records

    def _absorb_kv(self, key: bytes, value: bytes, mod_revision: int, stored: bytes) -> None:
        """`value` is the resolved value; `stored` what the key holds (a pointer for a chunked one)."""
        if key.startswith(self._log_prefix):
            for record in self._records_of(key, value, stored):
                self._absorb_record(record)
        elif key == self._head_key:
            self._write_head = max(self._write_head, int(value))
        elif key == self._floor_key:
            self._drop_through(int(value))
        elif key == self._snap_key and mod_revision > self._snapshot_rev:
            self._snapshot = codec.state_from_proto(state_pb2.ClusterState.FromString(value))
            self._snapshot_raw, self._snapshot_rev = stored, mod_revision
        elif key == self._prev_key and mod_revision > self._prev_rev:
            self._prev = codec.state_from_proto(state_pb2.ClusterState.FromString(value))
            self._prev_raw, self._prev_rev = stored, mod_revision

    def _absorb_records(self, records: list[Record], head: int) -> None:
        """Records read in one go (sorted) plus the head etcd held at that revision."""
        if not self._records:
            # An empty hot copy starts where etcd's records start (after a compaction: not at 1).
            start = records[0].seq if records else head + 1
            if start > self._first:
                self._first = start
        for record in records:
            self._absorb_record(record)
        self._write_head = max(self._write_head, head)

    def _absorb_record(self, record: Record) -> None:
        if record.seq <= self.head_seq:
            return  # already held (our own append, or a re-delivery)
        if record.seq != self.head_seq + 1:
            self._ahead[record.seq] = record
            return
        self._records.append(record)
        while (nxt := self._ahead.pop(self.head_seq + 1, None)) is not None:
            self._records.append(nxt)
        self._write_head = max(self._write_head, self.head_seq)

    def _absorb_delete(self, key: bytes) -> None:
        if key.startswith(self._log_prefix):
            self._drop_through(int(key[len(self._log_prefix) :]))

    def _drop_through(self, seq: int) -> None:
        if seq < self._first:
            return
        drop = min(seq + 1 - self._first, len(self._records))
        del self._records[:drop]
        self._first = seq + 1 if not self._records else self._records[0].seq

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- EventLog --------------------------------------------------------------------------
    @property
    def head_seq(self) -> int:
        return self._first + len(self._records) - 1

    @property
    def first_seq(self) -> int:
        return self._first

    async def append(
        self, events: Sequence[Event], *, term: int, time_unix_s: float, expect_seq: int | None = None
    ) -> list[Record]:
        if self._closed:
            raise LogUnavailable(f"etcd log {self.prefix} is closed")
        if self._fence_key is not None and term <= 0:
            raise ValueError(f"a fenced append needs the leader's term (> 0), got {term}")
        if not events:
            if expect_seq is not None and expect_seq != self._write_head:
                raise Fenced(expect_seq, self._write_head)
            return []
        pending = _Pending(events, term, time_unix_s, expect_seq)
        self._queue.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name=f"etcdlog-flush {self.prefix}")
        return await pending.done

    async def _flush(self) -> None:
        """Group commit: while appends wait, commit the longest consistent prefix in one txn."""
        while self._queue:
            batch = self._take_batch()
            if not batch:
                fenced = self._queue.pop(0)
                assert fenced.expect_seq is not None
                _fail(fenced, Fenced(fenced.expect_seq, self._write_head))
                continue
            try:
                retry = await self._commit(batch)
            except BaseException as exc:
                for pending in batch:
                    _fail(pending, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            self._queue[:0] = retry

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        head, size = self._write_head, 0
        while self._queue:
            nxt = self._queue[0]
            if nxt.expect_seq is not None and nxt.expect_seq != head:
                break  # judged against the head this batch leaves; Fenced if it still differs
            if batch and (nxt.term != batch[0].term or size + len(nxt.events) > self._max_records):
                break
            batch.append(self._queue.pop(0))
            head += len(nxt.events)
            size += len(nxt.events)
        return batch

    async def _commit(self, batch: list[_Pending]) -> list[_Pending]:
        """One transaction for `batch`; returns the unconditional appends to retry on a moved head."""
        base, term = self._write_head, batch[0].term
        compare: list[Any] = [
            tx.Value(self._head_key) == str(base).encode() if base else tx.Version(self._head_key) == 0
        ]
        if self._fence_key is not None:
            compare.append(tx.Create(self._fence_key) == term)
        records: list[list[Record]] = []
        values: list[tuple[int, bytes]] = []
        seq = base
        for pending in batch:
            mine = []
            for event in pending.events:
                seq += 1
                record = Record(seq, pending.term, pending.time_unix_s, event)
                mine.append(record)
                values.append((seq, codec.record_to_proto(record).SerializeToString()))
            records.append(mine)
        if len(values) > self._max_records:
            # More records than operations: all of them in one span value under the last seq.
            values = [(seq, encode_span(base + 1, [value for _, value in values]))]
        pointers = await self._out_of_line(values)
        blobs = {at: pointer.sha256 for at, pointer in pointers.items()}
        compare.extend(self._chunks_exist(pointers.values(), self._max_records + 1 - len(compare)))
        puts = [tx.Put(self._log_key(at), value) for at, value in values]
        puts.append(tx.Put(self._head_key, str(seq).encode()))
        failure = [tx.Get(self._head_key)]
        if self._fence_key is not None:
            failure.append(tx.Get(self._fence_key))
        flight = self._flight = _Flight(frozenset(self._log_key(at) for at, _ in values))
        try:
            ok, responses = await self._call(self._client.transaction(compare, puts, failure))
            if ok:
                self._record_blobs.update(blobs)
                for mine in records:
                    for record in mine:
                        self._absorb_record(record)
                flight.absorbed = True
        finally:  # (cancelled or failed too: a watch waiting on these keys reads them itself)
            self._flight = None
            flight.landed.set()
        if ok:
            for pending, mine in zip(batch, records):
                if not pending.done.done():
                    pending.done.set_result(mine)
            self._notify()
            return []
        head = int(responses[0][0][0]) if responses[0] else 0
        current = responses[1][0][1].create_revision if self._fence_key is not None and responses[1] else 0
        if pointers and head == base and (self._fence_key is None or current == term):
            # Neither the head nor the leader moved: a collection deleted these chunks between
            # their writing and this commit (they looked orphaned). Rewrite them and commit again.
            for pending in batch:
                pending.blob_retries += 1
                if pending.blob_retries > _BLOB_RETRIES:
                    _fail(pending, LogUnavailable(
                        f"etcd log {self.prefix}: the chunks of an out-of-line record vanished before its "
                        f"commit {pending.blob_retries} times (a collection racing it)"))
            return [pending for pending in batch if not pending.done.done()]
        # Chunks written for records that did not land stay unreferenced: drop them.
        for sha in set(blobs.values()) - set(self._record_blobs.values()):
            with contextlib.suppress(LogError):
                await self._delete_blob(sha)
        fetched: list[Record] = []
        if head > base:  # what the other writer appended, paged (it may be large)
            async for kv, revision in self._read_range(self._log_key(base + 1), self._log_key(head + 1)):
                value = await self._resolve(kv.value, revision)
                fetched.extend(r for r in self._records_of(kv.key, value, kv.value) if r.seq > base)
        self._absorb_records(fetched, head)
        self._notify()
        if self._fence_key is not None:
            if current != term:
                for pending in batch:
                    _fail(pending, Deposed(term, current, head))
                return []
        retry = []
        for pending in batch:
            if pending.expect_seq is None:
                retry.append(pending)
            else:
                _fail(pending, Fenced(pending.expect_seq, head))
        return retry

    async def _out_of_line(self, values: list[tuple[int, bytes]]) -> dict[int, Pointer]:
        """Replaces the largest values by pointers (their chunks written first) until each is at
        most chunk_bytes and all fit max_txn_bytes; returns seq -> pointer of those replaced."""
        total = sum(len(value) for _, value in values)
        blobs: dict[int, Pointer] = {}
        for index in sorted(range(len(values)), key=lambda i: len(values[i][1]), reverse=True):
            at, value = values[index]
            if len(value) <= self._chunk_bytes and total <= self._max_txn_bytes:
                break
            pointer = await self._store_blob(value)
            values[index] = (at, pointer.encode())
            total += len(values[index][1]) - len(value)
            blobs[at] = pointer
        return blobs

    def _chunks_exist(self, pointers: Iterable[Pointer], budget: int) -> list[Any]:
        """Compares that every chunk of `pointers` exists, for the transaction that commits them.

        Within `budget` compares, one per chunk. Beyond it, the first and last chunk of each blob:
        a collection deletes a whole blob in one request and a writer puts its chunks in order, so
        a deletion after the first put removes the first chunk, and one before it removes nothing
        the writer puts afterwards (only a second writer of the very same bytes, racing, could
        leave a gap, and its own commit compares the same keys)."""
        pointers = list(pointers)
        every = sum(pointer.chunks for pointer in pointers) <= budget
        compares: list[Any] = []
        for pointer in pointers:
            indexes = range(pointer.chunks) if every else sorted({0, pointer.chunks - 1})
            compares.extend(tx.Version(chunk_key(self._root, pointer.sha256, i)) > 0 for i in indexes)
        return compares

    def _log_key(self, seq: int) -> bytes:
        return self._log_prefix + b"%020d" % seq

    def read(self, since_seq: int = 1) -> Iterator[Record]:
        since = max(since_seq, 1)
        if since < self._first:
            raise LogCompacted(since, self._first)
        return iter(self._records[since - self._first :])

    async def follow(self, since_seq: int = 1) -> AsyncIterator[Record]:
        next_seq = max(since_seq, 1)
        while not self._closed:
            changed = self._changed
            for record in self.read(next_seq):
                yield record
                next_seq = record.seq + 1
            if self.head_seq < next_seq:
                await changed.wait()

    async def save_snapshot(self, state: ClusterState) -> None:
        if state.applied_seq > self.head_seq:
            raise ValueError(f"snapshot at seq {state.applied_seq} is beyond the log head {self.head_seq}")
        # The state is immutable: serialize it off the event loop (~0.25 s at 5,000 nodes).
        raw = await asyncio.to_thread(lambda: codec.state_to_proto(state).SerializeToString())
        stored, mine = raw, ""
        if len(raw) > self._chunk_bytes:  # chunks first; the snapshot key gets the pointer, last
            pointer = await self._store_blob(raw)
            stored, mine = pointer.encode(), pointer.sha256
        for attempt in range(5):
            if self._snapshot is not None and self._snapshot.applied_seq >= state.applied_seq:
                await self._drop_unreferenced((mine,))
                return  # a replica already stored this point or a later one
            if attempt and mine:  # a collection may have taken the chunks: rewriting is idempotent
                await self._store_blob(raw)
            replaced, replaced_rev = self._snapshot, self._snapshot_rev  # the watch may move them
            dropped = self._prev_raw
            success: list[Any] = [tx.Put(self._snap_key, stored), tx.Get(self._snap_key)]
            if self._snapshot_raw:
                success.insert(0, tx.Put(self._prev_key, self._snapshot_raw))
            # Compare-and-swap on the newest snapshot's revision, so `prev` is really the one we
            # replace; and the chunks the new pointer names must all be there.
            compare: list[Any] = [tx.Mod(self._snap_key) == self._snapshot_rev]
            if mine:
                compare.extend(self._chunks_exist([decode_pointer(stored)], self._max_records))
            ok, responses = await self._call(self._client.transaction(compare, success, []))
            if ok:
                revision = responses[-1][0][1].mod_revision
                if self._snapshot_raw:
                    self._prev, self._prev_raw, self._prev_rev = replaced, self._snapshot_raw, revision
                self._history_floor = replaced_rev
                self._snapshot, self._snapshot_raw = state, stored
                self._snapshot_rev = max(self._snapshot_rev, revision)
                if is_pointer(dropped):  # the snapshot that fell off; its chunks go too
                    await self._drop_unreferenced((decode_pointer(dropped).sha256,))
                return
            await self.sync()  # someone else saved one; rotate against theirs
        await self._drop_unreferenced((mine,))
        raise LogUnavailable(f"snapshot under {self.prefix} kept changing under us (5 tries)")

    async def _drop_unreferenced(self, shas: Sequence[str]) -> None:
        """Deletes snapshot blobs neither retained snapshot points at (best effort: gc is idempotent)."""
        kept = {decode_pointer(raw).sha256 for raw in (self._snapshot_raw, self._prev_raw) if is_pointer(raw)}
        for sha in shas:
            if sha and sha not in kept:
                with contextlib.suppress(LogError):
                    await self._delete_blob(sha)

    def load_snapshot(self) -> ClusterState | None:
        return self._snapshot

    async def compact(self) -> int:
        oldest = self._prev or self._snapshot
        if oldest is None or oldest.applied_seq < self._first:
            return 0
        covered = oldest.applied_seq
        dropped = min(covered, self.head_seq) - self._first + 1
        # Keys through `covered` go; a span holding `covered` and later seqs stays whole (its key
        # is its last seq), and the floor written with the deletion tells readers where to start.
        await self._call(self._client.transaction([], [
            tx.Delete(self._log_prefix, self._log_key(covered + 1)),
            tx.Put(self._floor_key, str(covered).encode()),
        ], []))
        self._drop_through(covered)
        self._notify()
        for seq in [seq for seq in self._record_blobs if seq <= covered]:
            await self._delete_blob(self._record_blobs.pop(seq))
        try:  # best effort: what a failed collection leaves, the next one finds
            await self.collect_garbage()
        except LogError as exc:
            log.warning("etcd log %s: collecting orphaned blobs failed (%r); next compaction retries", self.prefix, exc)
        await self._compact_history()
        return dropped

    async def collect_garbage(self) -> int:
        """Deletes orphaned blobs; returns how many. Called after each compaction (on the leader).

        A blob is orphaned when no retained record or snapshot points at it: an append or
        snapshot that failed (or whose process died) after writing its chunks, records another
        replica compacted, a deletion cut short. One is deleted only when two collections in a row
        saw it unreferenced and unchanged (so a writer between its chunks and its commit is not
        disturbed), and only in a transaction comparing that no pointer was committed since the
        references were taken (the head's and the snapshot's mod revisions) and that no chunk was
        rewritten since it was listed. A collection that loses the race deletes nothing: the next
        one looks again.
        """
        # Where etcd's head and snapshot are now (one read, one revision); the hot copy's
        # references are complete only if it holds that head and that snapshot (else: next time).
        _, cut = await self._call(self._client.transaction([], [tx.Get(self._head_key), tx.Get(self._snap_key)], []))
        head_kv = cut[0][0][1] if cut[0] else None
        head_mod = head_kv.mod_revision if head_kv is not None else 0
        snap_mod = cut[1][0][1].mod_revision if cut[1] else 0
        head = int(cut[0][0][0]) if cut[0] else 0
        if head != self.head_seq or snap_mod != self._snapshot_rev:
            return 0
        self._record_blobs = {seq: sha for seq, sha in self._record_blobs.items() if seq >= self._first}
        referenced = set(self._record_blobs.values())
        referenced.update(decode_pointer(raw).sha256 for raw in (self._snapshot_raw, self._prev_raw)
                          if is_pointer(raw))
        newest: dict[str, int] = {}
        async for kv, _ in self._read_range(self._blob_prefix, prefix_end(self._blob_prefix), keys_only=True):
            sha = kv.key[len(self._blob_prefix) :].split(b"/", 1)[0].decode()
            if sha not in referenced:
                newest[sha] = max(newest.get(sha, 0), kv.mod_revision)
        doomed = [sha for sha, revision in newest.items() if self._blob_suspects.get(sha) == revision]
        self._blob_suspects = {sha: revision for sha, revision in newest.items() if sha not in doomed}
        deleted = 0
        per_txn = max(1, self._max_records - 2)
        for start in range(0, len(doomed), per_txn):
            shas = doomed[start : start + per_txn]
            compare: list[Any] = [tx.Mod(self._head_key) == head_mod, tx.Mod(self._snap_key) == snap_mod]
            ops: list[Any] = []
            for sha in shas:
                directory = blob_directory(self._root, sha)
                compare.append(tx.Mod(directory, prefix_end(directory)) < newest[sha] + 1)
                ops.append(tx.Delete(directory, prefix_end(directory)))
            ok, _ = await self._call(self._client.transaction(compare, ops, []))
            if not ok:
                for sha in shas:  # judged again, from scratch, by the next collection
                    self._blob_suspects.pop(sha, None)
                break
            deleted += len(shas)
        if deleted:
            self.blobs_collected += deleted
            log.info("etcd log %s: collected %d orphaned blob(s)", self.prefix, deleted)
        return deleted

    async def _compact_history(self) -> None:
        """Compacts etcd's revision history (MVCC keeps every old value until then, counting against
        its backend quota) up to where the older retained snapshot was written. A watcher behind
        that gets RevisionCompactedError and reloads at one revision (sync), so nothing is lost;
        one within it resumes from its revision."""
        floor = self._history_floor
        if not self._compacts_history or floor <= self.compacted_revision:
            return
        try:
            await self._call(self._client.compact(floor))
        except LogUnavailable as exc:
            if not isinstance(exc.__cause__, aetcd.exceptions.RevisionCompactedError):
                raise
        self.compacted_revision = floor

    def close(self) -> None:
        self._closed = True
        for task in (self._watcher, self._flusher):
            if task is not None:
                task.cancel()
        for pending in self._queue:
            if not pending.done.done():
                pending.done.set_exception(LogUnavailable(f"etcd log {self.prefix} was closed"))
        self._queue.clear()
        self._notify()

    async def aclose(self) -> None:
        """close(), then waits for the watch to be cancelled on the (possibly shared) client.

        Waits a bounded time: a cancel swallowed by Python 3.11's wait_for (its call finished in
        the same iteration) is repeated, and a task still running after that is logged, not awaited."""
        self.close()
        for task in (self._watcher, self._flusher):
            for _ in range(3):
                if task is None or task.done():
                    break
                await asyncio.wait({task}, timeout=self._timeout_s)
                task.cancel()
            if task is not None and task.done() and not task.cancelled():
                task.exception()  # retrieved: the log was closing anyway
            elif task is not None and not task.done():
                log.warning("etcd log %s: task %s did not stop after close", self.prefix, task.get_name())

    # -- the boundary ----------------------------------------------------------------------
    async def _call(self, call: Awaitable[T]) -> T:
        """Runs one etcd call under the deadline; translates client errors (DESIGN: say if retryable)."""
        try:
            return await within(call, self._timeout_s)
        except TimeoutError as exc:
            raise LogUnavailable(f"etcd did not answer within {self._timeout_s}s ({self.prefix})") from exc
        except aetcd.exceptions.ClientError as exc:
            if _is_unavailable(exc):
                raise LogUnavailable(f"etcd unavailable ({self.prefix}): {exc}") from exc
            raise LogError(f"etcd refused a request on {self.prefix}: {exc}") from exc


def _fail(pending: _Pending, exc: BaseException) -> None:
    if not pending.done.done():  # the appender may have been cancelled meanwhile
        pending.done.set_exception(exc)
