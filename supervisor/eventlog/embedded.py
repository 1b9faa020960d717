"""Embedded EventLog: segment files on the supervisor's own disk, for one-machine deployments.

Layout of the directory:
  FORMAT                  "ftsup-eventlog 1": a newer format is refused, never misread
  LOCK                    flock()ed by the one process that owns the log; holds its pid
  segments/<seq>.seg      header (magic, version), then frames (u32 length, u32 CRC-32C, Record)
  snapshots/<seq>.snap    the folded state at <seq>; the newest two are kept
Appends are group-committed: every append waiting while a write+fsync is in progress goes into
the next one, and each is acknowledged only after the fsync that covers it. On open, a torn or
corrupt tail of the last segment is truncated and reported; a bad frame with good data after it,
or in any older segment, is corruption and raises LogCorrupt naming the segment and offset.
Segments are compacted away only once the older retained snapshot covers them, so a damaged
newest snapshot can always fall back to the older one plus the log.
Every file call goes through `fileops.FileOps`, so tests can simulate power loss (lost, zeroed or
torn unsynced bytes; unsynced directory entries) where a killed process would keep the page cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import struct
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass

from ftsup.supervisor import codec
from ftsup.supervisor.core.events import Event, Record
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog import frames, snapshots
from ftsup.supervisor.eventlog.api import (
    Fenced,
    LogCompacted,
    LogCorrupt,
    LogFormatError,
    LogUnavailable,
)
from ftsup.supervisor.eventlog.fileops import (
    OS_FILE_OPS,
    FileOps,
    WritableFile,
    make_dirs,
    write_all,
    write_durably,
)
from ftsup.supervisor.eventlog.follow import AppendSignal
from ftsup.v1 import events_pb2

FORMAT_VERSION = 1
FORMAT_NAME = "ftsup-eventlog"
SEGMENT_MAGIC = b"FTSUPSEG"
SEGMENT_HEADER = struct.Struct("<8sII")  # magic, format version, reserved
SEGMENT_SUFFIX = ".seg"
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
KEEP_SNAPSHOTS = 2


@dataclass(slots=True)
class Segment:
    path: pathlib.Path
    first_seq: int
    count: int
    size: int

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1


@dataclass(slots=True)
class _PendingAppend:
    events: Sequence[Event]
    term: int
    time_unix_s: float
    expect_seq: int | None
    done: asyncio.Future[list[Record]]


def segment_name(first_seq: int) -> str:
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def list_segment_paths(directory: pathlib.Path, ops: FileOps = OS_FILE_OPS) -> list[tuple[int, pathlib.Path]]:
    found = []
    for name in ops.names(directory / "segments"):
        stem = name.removesuffix(SEGMENT_SUFFIX)
        if name.endswith(SEGMENT_SUFFIX) and stem.isdigit():
            found.append((int(stem), directory / "segments" / name))
    return sorted(found)


def check_format(directory: pathlib.Path, *, create: bool, ops: FileOps = OS_FILE_OPS) -> None:
    """Refuses directories written by a newer ftsup (or by the 0.1 single-file format)."""
    path = directory / "FORMAT"
    if ops.exists(path):
        text = ops.read(path).decode(errors="replace")
        words = text.split()
        if len(words) != 2 or words[0] != FORMAT_NAME or not words[1].isdigit():
            raise LogFormatError(f"{path}: not an ftsup event log format file ({text[:40]!r})")
        if int(words[1]) > FORMAT_VERSION:
            raise LogFormatError(
                f"{directory}: event log format {words[1]} was written by a newer ftsup;"
                f" this one reads format {FORMAT_VERSION}. Upgrade ftsup, do not edit the files."
            )
        return
    if ops.exists(directory / "events.log"):
        raise LogFormatError(
            f"{directory}: holds an ftsup 0.1 single-file log (events.log), which this version does"
            " not read; start with an empty --data-dir"
        )
    if create:
        # Written whole (fsynced before the rename): an empty FORMAT after a crash would be refused.
        write_durably(ops, path, f"{FORMAT_NAME} {FORMAT_VERSION}\n".encode())


@dataclass(frozen=True, slots=True)
class SegmentCheck:
    """What a segment file holds, judged without changing it (shared by open and `ftsup log inspect`)."""

    count: int  # good records
    good_end: int  # byte offset just past the last good record
    file_bytes: int
    problem: str  # empty when the whole file is good
    is_torn_tail: bool  # the problem is an interrupted final write: truncating it loses nothing acknowledged
    is_newer_format: bool = False


def examine_segment(path: pathlib.Path, first_seq: int, data: bytes, *, is_last: bool) -> SegmentCheck:
    size = len(data)
    if size < SEGMENT_HEADER.size:
        problem = f"{path}: truncated segment header ({size} bytes)"
        return SegmentCheck(0, 0, size, problem, is_torn_tail=is_last)
    magic, version, _ = SEGMENT_HEADER.unpack_from(data)
    if magic != SEGMENT_MAGIC:
        return SegmentCheck(0, 0, size, f"{path}: not an ftsup segment (magic {magic!r}) at byte offset 0", False)
    if version > FORMAT_VERSION:
        problem = f"{path}: segment format {version} is newer than this ftsup reads ({FORMAT_VERSION})"
        return SegmentCheck(0, 0, size, problem, False, is_newer_format=True)
    result = frames.scan(data, SEGMENT_HEADER.size)
    count = len(result.payloads)
    for position in (0, count - 1) if count else ():
        record = decode_record(result.payloads[position], path, position)
        if record.seq != first_seq + position:
            problem = f"{path}: record {position} has seq {record.seq}, expected {first_seq + position}"
            return SegmentCheck(count, result.good_end, size, problem, False)
    if not result.problem:
        return SegmentCheck(count, result.good_end, size, "", False)
    is_torn = is_last and not frames.has_frame_after(data, result.good_end)
    after = "" if is_torn or not is_last else ", with records after it"
    problem = f"{path}: {result.problem} at byte offset {result.good_end}{after}"
    return SegmentCheck(count, result.good_end, size, problem, is_torn)


def decode_record(payload: bytes, path: pathlib.Path, position: int) -> Record:
    try:
        return codec.record_from_proto(events_pb2.Record.FromString(payload))
    except Exception as exc:
        raise LogCorrupt(f"{path} record {position}: passes its CRC but does not decode: {exc}") from exc


class EmbeddedLog:
    def __init__(
        self, directory: pathlib.Path, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES, ops: FileOps = OS_FILE_OPS
    ) -> None:
        if segment_bytes < 4096:
            raise ValueError(f"segment_bytes must be at least 4096, got {segment_bytes}")
        self.directory = directory
        self._segment_bytes = segment_bytes
        self._ops = ops
        make_dirs(ops, directory)
        self._unlock: Callable[[], None] | None = ops.lock(directory / "LOCK")
        try:
            check_format(directory, create=True, ops=ops)
            make_dirs(ops, directory / "segments")
            make_dirs(ops, directory / "snapshots")
            self.truncated_bytes = 0  # torn tail removed by this open
            self.truncated_segment: pathlib.Path | None = None
            self.snapshot_warnings: list[str] = []
            self._segments = self._open_segments()
            self._file: WritableFile | None = ops.open_append(self._segments[-1].path) if self._segments else None
        except BaseException:
            self._unlock()
            raise
        self._cache: list[Record] = []  # records since `_cache_first`, decoded
        self._cache_first = self.head_seq + 1
        self._pending: list[_PendingAppend] = []
        self._writer: asyncio.Task[None] | None = None
        self._appended = AppendSignal()

    # -- open ---------------------------------------------------------------------------------
    def _open_segments(self) -> list[Segment]:
        found = list_segment_paths(self.directory, self._ops)
        segments: list[Segment] = []
        for index, (first_seq, path) in enumerate(found):
            is_last = index == len(found) - 1
            segment = self._open_segment(path, first_seq, is_last)
            if segments and segment.first_seq != segments[-1].last_seq + 1:
                raise LogCorrupt(
                    f"{path}: starts at seq {segment.first_seq} but the previous segment ends at"
                    f" {segments[-1].last_seq}: records are missing"
                )
            segments.append(segment)
        return segments

    def _open_segment(self, path: pathlib.Path, first_seq: int, is_last: bool) -> Segment:
        check = examine_segment(path, first_seq, self._ops.read(path), is_last=is_last)
        if check.problem and not check.is_torn_tail:
            if check.is_newer_format:
                raise LogFormatError(check.problem)
            raise LogCorrupt(check.problem)
        if check.is_torn_tail:
            self._report_truncation(path, check.file_bytes - check.good_end)
            if check.good_end < SEGMENT_HEADER.size:
                self._write_segment_header(path)  # a crash while creating the newest segment
            else:
                self._ops.truncate(path, check.good_end)
        return Segment(path, first_seq, check.count, max(check.good_end, SEGMENT_HEADER.size))

    def _report_truncation(self, path: pathlib.Path, nbytes: int) -> None:
        self.truncated_bytes += nbytes
        self.truncated_segment = path

    def _write_segment_header(self, path: pathlib.Path) -> None:
        handle = self._ops.create(path)
        try:
            write_all(handle, SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0))
            handle.sync()
        finally:
            handle.close()

    # -- positions ----------------------------------------------------------------------------
    @property
    def head_seq(self) -> int:
        if not self._segments:
            return 0
        return self._segments[-1].last_seq

    @property
    def first_seq(self) -> int:
        return self._segments[0].first_seq if self._segments else 1

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    # -- append (group commit) ----------------------------------------------------------------
    async def append(
        self, events: Sequence[Event], *, term: int, time_unix_s: float, expect_seq: int | None = None
    ) -> list[Record]:
        if not events:
            return []
        loop = asyncio.get_running_loop()
        pending = _PendingAppend(events, term, time_unix_s, expect_seq, loop.create_future())
        self._pending.append(pending)
        if self._writer is None:
            self._writer = loop.create_task(self._write_loop())
        return await pending.done

    async def _write_loop(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._commit(batch)
        finally:
            self._writer = None

    async def _commit(self, batch: list[_PendingAppend]) -> None:
        head = self.head_seq
        accepted: list[tuple[_PendingAppend, list[Record]]] = []
        for pending in batch:
            if pending.expect_seq is not None and pending.expect_seq != head:
                pending.done.set_exception(Fenced(pending.expect_seq, head))
                continue
            records = [
                Record(head + 1 + i, pending.term, pending.time_unix_s, event) for i, event in enumerate(pending.events)
            ]
            head += len(records)
            accepted.append((pending, records))
        if not accepted:
            return
        records = [record for _, group in accepted for record in group]
        try:
            payloads = [codec.record_to_proto(r).SerializeToString() for r in records]
            written = await asyncio.to_thread(self._write_frames, records[0].seq, payloads)
        except (OSError, ValueError) as exc:
            error = LogUnavailable(f"cannot append to the event log in {self.directory}: {exc}")
            for pending, _ in accepted:
                if not pending.done.done():
                    pending.done.set_exception(error)
            return
        self._apply_written(written)
        self._cache.extend(records)
        for pending, group in accepted:
            if not pending.done.done():
                pending.done.set_result(group)
        await self._appended.notify()

    def _write_frames(self, first_seq: int, payloads: list[bytes]) -> list[tuple[Segment, int, int]]:
        """Writes and fsyncs, in a worker thread; returns (segment, bytes, records) to apply.

        Positions are applied by the event loop afterwards, so readers never see a record
        counted before it is durable. On failure every file is left as it was.
        """
        groups: list[tuple[int, list[bytes]]] = []  # (first seq of a new segment, or 0; frames)
        size = self._segments[-1].size if self._segments else 0
        open_new = not self._segments
        for index, payload in enumerate(payloads):
            framed = frames.frame(payload)
            if open_new or (size + len(framed) > self._segment_bytes and size > SEGMENT_HEADER.size):
                groups.append((first_seq + index, []))
                size = SEGMENT_HEADER.size
                open_new = False
            elif not groups:
                groups.append((0, []))
            groups[-1][1].append(framed)
            size += len(framed)
        undo: list[tuple[pathlib.Path, int | None]] = []  # (file, size before), None: remove it
        written: list[tuple[Segment, int, int]] = []
        try:
            for new_first, framed_list in groups:
                if new_first:
                    path = self.directory / "segments" / segment_name(new_first)
                    undo.append((path, None))
                    self._write_segment_header(path)
                    self._ops.sync_dir(self.directory / "segments")
                    if self._file is not None:
                        self._file.close()
                    self._file = self._ops.open_append(path)
                    segment = Segment(path, new_first, 0, SEGMENT_HEADER.size)
                else:
                    segment = self._segments[-1]
                    undo.append((segment.path, segment.size))
                if self._file is None:
                    raise OSError(f"{segment.path} could not be reopened after a failed write")
                blob = b"".join(framed_list)
                write_all(self._file, blob)
                self._file.sync()
                written.append((segment, len(blob), len(framed_list)))
        except OSError:
            self._undo(undo)
            raise
        return written

    def _apply_written(self, written: list[tuple[Segment, int, int]]) -> None:
        for segment, nbytes, count in written:
            if not self._segments or self._segments[-1] is not segment:
                self._segments.append(segment)
            segment.size += nbytes
            segment.count += count

    def _undo(self, undo: list[tuple[pathlib.Path, int | None]]) -> None:
        for path, size in reversed(undo):
            with contextlib.suppress(OSError):
                if size is None:
                    self._ops.remove(path)
                else:
                    self._ops.truncate(path, size)
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        # Left None when the segment cannot be reopened: the next append fails with LogUnavailable.
        with contextlib.suppress(OSError):
            self._file = self._ops.open_append(self._segments[-1].path) if self._segments else None

    # -- read ---------------------------------------------------------------------------------
    def read(self, since_seq: int = 1) -> Iterator[Record]:
        since = max(since_seq, 1)
        if since < self.first_seq:
            raise LogCompacted(since, self.first_seq)
        return self._read(since)

    def _read(self, since: int) -> Iterator[Record]:
        if since < self._cache_first:
            yield from self._read_disk(since, self._cache_first - 1)
            since = self._cache_first
        yield from self._cache[since - self._cache_first :]

    def _read_disk(self, since: int, until: int) -> Iterator[Record]:
        # The replay path at start-up: a million records; keep the per-record work minimal.
        parse = events_pb2.Record.FromString
        to_core = codec.record_from_proto
        for segment in list(self._segments):
            if segment.last_seq < since or segment.first_seq > until:
                continue
            data = self._ops.read(segment.path)[: segment.size]
            result = frames.scan(data, SEGMENT_HEADER.size)
            start = max(since, segment.first_seq) - segment.first_seq
            stop = min(segment.count, until - segment.first_seq + 1)
            if stop > len(result.payloads):
                raise LogCorrupt(f"{segment.path}: {result.problem} at byte offset {result.good_end}")
            seq = segment.first_seq + start
            for position in range(start, stop):
                try:
                    record = to_core(parse(result.payloads[position]))
                except Exception as exc:
                    raise LogCorrupt(f"{segment.path} record {position}: passes its CRC but does not decode: {exc}") from exc
                if record.seq != seq:
                    raise LogCorrupt(f"{segment.path}: record {position} has seq {record.seq}, expected {seq}")
                seq += 1
                yield record

    def follow(self, since_seq: int = 1) -> AsyncIterator[Record]:
        return self._appended.follow(self.read, lambda: self.head_seq, since_seq)

    # -- snapshots and compaction -------------------------------------------------------------
    async def save_snapshot(self, state: ClusterState) -> None:
        if state.applied_seq > self.head_seq:
            raise ValueError(f"snapshot at seq {state.applied_seq} is beyond the log head {self.head_seq}")
        directory = self.directory / "snapshots"
        try:
            await asyncio.to_thread(snapshots.write_snapshot, directory, state, self._ops)
            kept = snapshots.list_snapshots(directory, self._ops)
        except OSError as exc:
            raise LogUnavailable(f"cannot write a snapshot in {directory}: {exc}") from exc
        for old in kept[:-KEEP_SNAPSHOTS]:
            with contextlib.suppress(OSError):
                self._ops.remove(old.path)
        # Records the snapshot covers are no longer needed in memory; reads of them go to disk.
        drop = min(state.applied_seq, self.head_seq) + 1 - self._cache_first
        if drop > 0:
            del self._cache[:drop]
            self._cache_first += drop

    def load_snapshot(self) -> ClusterState | None:
        for snapshot in reversed(snapshots.list_snapshots(self.directory / "snapshots", self._ops)):
            try:
                state = snapshots.read_snapshot(snapshot, self._ops)
            except snapshots.BadSnapshot as exc:
                self.snapshot_warnings.append(f"skipped unusable snapshot: {exc}")
                continue
            if state.applied_seq + 1 < self.first_seq:
                raise LogCorrupt(
                    f"{snapshot.path} (seq {state.applied_seq}) is older than the oldest record kept"
                    f" ({self.first_seq}); the records between were compacted"
                )
            return state
        if self.first_seq > 1:
            raise LogCorrupt(
                f"{self.directory}: records before seq {self.first_seq} were compacted but no usable"
                f" snapshot covers them; {'; '.join(self.snapshot_warnings) or 'no snapshot files'}"
            )
        return None

    async def compact(self, *, through_newest: bool = False) -> int:
        """Drops segments the older retained snapshot covers (the newer one's fallback).

        `through_newest` (the offline tool, after reading the new snapshot back) drops what the
        newest covers instead, trading the fallback for the space.
        """
        kept = snapshots.list_snapshots(self.directory / "snapshots", self._ops)
        if not kept:
            return 0
        covered = kept[-1].seq if through_newest else kept[0].seq
        removed = 0
        while len(self._segments) > 1 and self._segments[0].last_seq <= covered:
            segment = self._segments.pop(0)
            removed += segment.count
            with contextlib.suppress(FileNotFoundError):
                self._ops.remove(segment.path)
        if removed:
            self._ops.sync_dir(self.directory / "segments")
        return removed

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._unlock is not None:
            self._unlock()
            self._unlock = None
