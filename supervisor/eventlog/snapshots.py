"""State snapshot files: the folded ClusterState at some seq, so replay need not start at 1.

File = magic "FTSUPSNP", u32 format version, u32 CRC-32C of the payload, u64 payload length,
payload (`ftsup.v1.StateSnapshot`). Written to a temporary name, fsynced, renamed, directory
fsynced (fileops.write_durably): a snapshot is either whole or absent. A snapshot that fails its checks is skipped with a
warning in favour of an older one (the log keeps the segments that older snapshot needs).
"""

from __future__ import annotations

import pathlib
import struct
from dataclasses import dataclass

from ftsup.supervisor import codec
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.api import LogFormatError
from ftsup.supervisor.eventlog.fileops import OS_FILE_OPS, FileOps, write_durably
from ftsup.supervisor.eventlog.frames import crc32c
from ftsup.v1 import state_pb2

MAGIC = b"FTSUPSNP"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQ")
SUFFIX = ".snap"


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    path: pathlib.Path
    seq: int


class BadSnapshot(ValueError):
    """A snapshot file that is truncated, corrupt or unreadable; the text says which and why."""


def list_snapshots(directory: pathlib.Path, ops: FileOps = OS_FILE_OPS) -> list[SnapshotFile]:
    found = []
    for name in ops.names(directory):
        stem = name.removesuffix(SUFFIX)
        if name.endswith(SUFFIX) and stem.isdigit():
            found.append(SnapshotFile(directory / name, int(stem)))
    return sorted(found, key=lambda s: s.seq)


def write_snapshot(directory: pathlib.Path, state: ClusterState, ops: FileOps = OS_FILE_OPS) -> SnapshotFile:
    message = state_pb2.StateSnapshot(format_version=FORMAT_VERSION, state=codec.state_to_proto(state))
    payload = message.SerializeToString()
    blob = HEADER.pack(MAGIC, FORMAT_VERSION, crc32c(payload), len(payload)) + payload
    final = directory / f"{state.applied_seq:020d}{SUFFIX}"
    write_durably(ops, final, blob)
    return SnapshotFile(final, state.applied_seq)


def read_snapshot(snapshot: SnapshotFile, ops: FileOps = OS_FILE_OPS) -> ClusterState:
    data = ops.read(snapshot.path)
    if len(data) < HEADER.size:
        raise BadSnapshot(f"{snapshot.path}: truncated ({len(data)} bytes, header needs {HEADER.size})")
    magic, version, crc, length = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BadSnapshot(f"{snapshot.path}: not an ftsup snapshot (magic {magic!r})")
    if version > FORMAT_VERSION:
        raise LogFormatError(
            f"{snapshot.path}: snapshot format {version} is newer than this ftsup reads ({FORMAT_VERSION})"
        )
    payload = data[HEADER.size :]
    if len(payload) != length:
        raise BadSnapshot(f"{snapshot.path}: truncated (payload {len(payload)} of {length} bytes)")
    if crc32c(payload) != crc:
        raise BadSnapshot(f"{snapshot.path}: CRC-32C mismatch")
    message = state_pb2.StateSnapshot.FromString(payload)
    state = codec.state_from_proto(message.state)
    if state.applied_seq != snapshot.seq:
        raise BadSnapshot(f"{snapshot.path}: holds seq {state.applied_seq}, its name says {snapshot.seq}")
    return state
