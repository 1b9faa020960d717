"""Values too large for one etcd request, and reads too large for one etcd response.

etcd refuses a request over `--max-request-bytes` (1.5 MiB by default) and aetcd's gRPC channel
refuses a response over 4 MiB. A state snapshot of 12,500 nodes x 8 ranks is ~3 MiB, and so is
the GenerationStarted record that assigns their ranks. So:
  - A large value is stored content-addressed, in chunks under `<prefix>/blob/<sha256>/<n:06d>`,
    each written by its own request; the key that makes it visible (a log record, the snapshot)
    then holds a small pointer, written last, in the transaction that was always going to write
    that key (so the fenced append and the snapshot's compare-and-swap are unchanged). A reader
    that sees a pointer fetches the chunks at the pointer's revision: they are all there, since
    they were written before it and are deleted only after it stops being referenced.
  - Every read of a range is paged (`limit`, continuing after the last key), all pages at the
    revision of the first, so a reader sees one consistent state without one huge response.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import aetcd
from aetcd import exceptions as aetcd_exceptions
from aetcd import rpc

POINTER_MAGIC = b"FTSUP-BLOB/1 "  # never the first bytes of a Record or ClusterState proto
DEFAULT_CHUNK_BYTES = 512 * 1024
RESPONSE_BUDGET_BYTES = 3 * 1024 * 1024  # under gRPC's 4 MiB default receive limit, with margin
BLOB_DIR = b"blob/"


@dataclass(frozen=True, slots=True)
class Pointer:
    sha256: str
    size: int
    chunks: int

    def encode(self) -> bytes:
        return POINTER_MAGIC + json.dumps({"sha256": self.sha256, "size": self.size, "chunks": self.chunks}).encode()


def is_pointer(value: bytes) -> bool:
    return value.startswith(POINTER_MAGIC)


def decode_pointer(value: bytes) -> Pointer:
    try:
        body = json.loads(value[len(POINTER_MAGIC) :])
        return Pointer(str(body["sha256"]), int(body["size"]), int(body["chunks"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed blob pointer {value[:80]!r}: {exc}") from exc


def split(value: bytes, chunk_bytes: int) -> tuple[Pointer, list[bytes]]:
    chunks = [value[i : i + chunk_bytes] for i in range(0, len(value), chunk_bytes)] or [b""]
    return Pointer(hashlib.sha256(value).hexdigest(), len(value), len(chunks)), chunks


def chunk_key(root: bytes, sha256: str, index: int) -> bytes:
    return blob_directory(root, sha256) + b"%06d" % index


def blob_directory(root: bytes, sha256: str) -> bytes:
    return root + BLOB_DIR + sha256.encode() + b"/"


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key starting with `prefix` (etcd's range_end for a prefix)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


async def range_page(
    client: aetcd.Client, start: bytes, end: bytes, *, limit: int, revision: int = 0, keys_only: bool = False
) -> Any:
    """One Range call with `limit` and `revision` (aetcd's get_range has neither)."""
    await client.connect()
    request = rpc.RangeRequest(key=start, range_end=end, limit=limit, revision=revision, keys_only=keys_only)
    try:
        return await client.kvstub.Range(request, timeout=client._timeout, metadata=client.metadata)
    except rpc.AioRpcError as exc:
        aetcd_exceptions._handle_exception(exc)
