"""The object-store seam: the few operations checkpoints need, with one contract for every backend.

`LocalDirStore` (the embedded default) and `S3Store` implement it and are both run through
tests/support/objectstore_contract.py. Rules every implementation keeps: `put` is atomic (a reader
sees the old object, no object, or the whole new one, never a prefix); `put_if_absent` never
overwrites (the commit protocol relies on it); `head` reports the digest of the stored bytes in the
form of trainer.checkpoint.digest; keys are '/'-separated relative names. A writer that dies mid-put
leaves a `PendingUpload` (an S3 multipart upload, a local temp file) that no listing of objects
shows; `list_uploads`/`abort_upload` let retention find and remove them (catalog.gc).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ftsup.checkpoint.digest import Chunking

_KEY = re.compile(r"^[A-Za-z0-9._\-][A-Za-z0-9._\-/]*$")

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What the store holds at `key`: its size and digest (hex SHA-256, or composite `-N`)."""

    key: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class PendingUpload:
    """An unfinished write the store keeps paying for: an S3 multipart upload, a local temp file."""

    key: str  # S3: the object it would become; local: the temp file's own key
    upload_id: str  # S3: the UploadId; local: the temp file's name
    initiated_unix_s: float  # S3: when the upload was created (server clock); local: last write (mtime)


@runtime_checkable
class ObjectStore(Protocol):
    @property
    def chunking(self) -> Chunking: ...

    def describe(self) -> str:
        """Where the store points (never credentials), for logs and errors."""
        ...

    def put(self, key: str, data: Buffer) -> ObjectInfo:
        """Store `data` at `key` atomically, replacing any object there."""
        ...

    def put_many(self, items: Sequence[tuple[str, Buffer]]) -> list[ObjectInfo]:
        """`put` of several objects, in parallel where the store can; results in the items' order."""
        ...

    def put_if_absent(self, key: str, data: Buffer) -> ObjectInfo:
        """Store `data` at `key` only if nothing is there; raises ObjectExists otherwise."""
        ...

    def get(self, key: str) -> bytearray:
        """The whole object (writable, so tensors can be built on it without a copy); raises ObjectNotFound."""
        ...

    def head(self, key: str) -> ObjectInfo:
        """Size and digest of the stored object; raises ObjectNotFound."""
        ...

    def list(self, prefix: str) -> tuple[str, ...]:
        """Every key under `prefix` (recursively), sorted."""
        ...

    def delete(self, keys: Sequence[str]) -> None:
        """Remove the objects; keys already absent are fine."""
        ...

    def list_uploads(self, prefix: str) -> tuple[PendingUpload, ...]:
        """Unfinished writes under `prefix`, live or abandoned (the store cannot tell), sorted by key."""
        ...

    def abort_upload(self, upload: PendingUpload) -> None:
        """Discard an unfinished write (never a stored object); one already gone is fine."""
        ...


def validate_key(key: str) -> str:
    """A relative '/'-separated key without empty, '.' or '..' segments."""
    if not isinstance(key, str) or not _KEY.match(key) or any(
            part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid object key {key!r}: use relative '/'-separated names of [A-Za-z0-9._-]")
    return key


def join_key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))
