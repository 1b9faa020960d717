"""Embedded EventLog: one append-only file of framed records on the supervisor's disk.

Frame = u32 length, u32 CRC-32 of the payload, payload (an `ftsup.v1.Record`). An append
writes its frames in one write and fsyncs before returning, so an acknowledged event survives
a crash. On open, a torn or corrupt *last* frame (a crash mid-write) is truncated and reported;
a bad frame followed by good data is corruption and raises LogCorrupt naming file and offset.
This is the first version: segments, group commit, CRC32C and snapshots come with issue 3.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import struct
import zlib
from collections.abc import AsyncIterator, Iterator, Sequence

from ftsup.v1 import events_pb2
from supervisor import codec
from supervisor.core.events import Event, Record
from supervisor.eventlog.api import LogCorrupt, LogUnavailable
from supervisor.eventlog.cache import RecordCache

_HEADER = struct.Struct("<II")
MAX_RECORD_BYTES = 16 * 1024 * 1024


class EmbeddedLog:
    def __init__(self, directory: pathlib.Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "events.log"
        self._cache = RecordCache()
        self.truncated_bytes = 0  # how much torn tail the last open removed
        self._load()
        self._file = open(self.path, "ab", buffering=0)
        self._lock = asyncio.Lock()

    @property
    def head_seq(self) -> int:
        return self._cache.head_seq

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        offset = 0
        good_end = 0
        while offset < len(data):
            frame = _parse_frame(data, offset)
            if frame is None:
                if _has_valid_frame_after(data, offset):
                    raise LogCorrupt(f"{self.path}: bad record frame at byte offset {offset} before the tail")
                break
            payload, next_offset = frame
            message = events_pb2.Record.FromString(payload)
            record = codec.record_from_proto(message)
            if record.seq != self.head_seq + 1:
                raise LogCorrupt(
                    f"{self.path}: record at byte offset {offset} has seq {record.seq},"
                    f" expected {self.head_seq + 1}"
                )
            self._cache.load(record)
            offset = good_end = next_offset
        if good_end < len(data):
            self.truncated_bytes = len(data) - good_end
            with open(self.path, "r+b") as handle:
                handle.truncate(good_end)
                os.fsync(handle.fileno())

    async def append(self, events: Sequence[Event], *, term: int, time_unix_s: float) -> list[Record]:
        async with self._lock:
            start = self.head_seq + 1
            records = [Record(start + i, term, time_unix_s, event) for i, event in enumerate(events)]
            blob = b"".join(_frame(codec.record_to_proto(r).SerializeToString()) for r in records)
            try:
                await asyncio.to_thread(self._write, blob)
            except OSError as exc:
                raise LogUnavailable(f"cannot append to {self.path}: {exc}") from exc
            await self._cache.publish(records)
        return records

    def _write(self, blob: bytes) -> None:
        position = self._file.tell()
        try:
            self._file.write(blob)
            os.fsync(self._file.fileno())
        except OSError:
            # Leave no partial frame behind for the next append to build on.
            self._file.truncate(position)
            raise

    def read(self, since_seq: int = 1) -> Iterator[Record]:
        return self._cache.read(since_seq)

    def follow(self, since_seq: int = 1) -> AsyncIterator[Record]:
        return self._cache.follow(since_seq)

    def close(self) -> None:
        self._file.close()


def _frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _parse_frame(data: bytes, offset: int) -> tuple[bytes, int] | None:
    if offset + _HEADER.size > len(data):
        return None
    length, crc = _HEADER.unpack_from(data, offset)
    start = offset + _HEADER.size
    if length > MAX_RECORD_BYTES or start + length > len(data):
        return None
    payload = data[start : start + length]
    if zlib.crc32(payload) != crc:
        return None
    return payload, start + length


def _has_valid_frame_after(data: bytes, offset: int) -> bool:
    """Whether any well-formed frame starts later: then the damage is not a torn tail."""
    for candidate in range(offset + 1, len(data) - _HEADER.size):
        frame = _parse_frame(data, candidate)
        if frame is not None and frame[1] - candidate > _HEADER.size + 2:
            return True
    return False
