"""How an object is cut into parts and what its recorded SHA-256 is. Pure: hashlib only, no I/O.

One SHA-256 pass per byte serves both purposes: the part's S3 `ChecksumSHA256` (the server
verifies it and rejects a corrupted body; s3.py skips botocore's own payload hash for these
uploads) and the manifest's digest.
So an object's digest follows S3's own convention: an object stored in one part records the
plain SHA-256 of its bytes (hex); an object stored in N > 1 parts records the composite
`sha256(d_1 || ... || d_N)` of the part digests, suffixed `-N`, and the manifest records the part
size so a reader can recompute it from the bytes alone. Hashing twice (parts and whole) would cost
a second full pass on a CPU-bound machine for no extra assurance.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass

MIB = 1 << 20
S3_MIN_PART_BYTES = 5 * MIB  # every part but the last must be at least this large on S3
S3_MAX_PARTS = 10_000
_DIGEST = re.compile(r"^[0-9a-f]{64}(-[1-9][0-9]*)?$")


@dataclass(frozen=True, slots=True)
class Chunking:
    """Objects larger than `multipart_threshold_bytes` go in parts of `part_size_bytes`."""

    multipart_threshold_bytes: int = 32 * MIB
    part_size_bytes: int = 16 * MIB

    def __post_init__(self) -> None:
        if self.part_size_bytes < S3_MIN_PART_BYTES:
            raise ValueError(
                f"Chunking.part_size_bytes={self.part_size_bytes} is below S3's minimum part size {S3_MIN_PART_BYTES}"
            )
        if self.multipart_threshold_bytes < self.part_size_bytes:
            raise ValueError(
                f"Chunking.multipart_threshold_bytes={self.multipart_threshold_bytes} is below"
                f" part_size_bytes={self.part_size_bytes}"
            )

    def part_ranges(self, size_bytes: int) -> tuple[tuple[int, int], ...]:
        """[start, end) byte ranges of the parts an object of `size_bytes` is stored in."""
        if size_bytes < 0:
            raise ValueError(f"object size must be >= 0, got {size_bytes}")
        if size_bytes <= self.multipart_threshold_bytes:
            return ((0, size_bytes),)
        step = self.part_size_bytes
        ranges = tuple((start, min(start + step, size_bytes)) for start in range(0, size_bytes, step))
        if len(ranges) > S3_MAX_PARTS:
            raise ValueError(f"object of {size_bytes} bytes needs {len(ranges)} parts, above S3's {S3_MAX_PARTS}")
        return ranges


def part_digest(data: bytes | bytearray | memoryview) -> bytes:
    """Raw SHA-256 of one part (hashlib releases the GIL on large buffers, so threads hash in parallel)."""
    return hashlib.sha256(data).digest()


def combine(part_digests: list[bytes] | tuple[bytes, ...]) -> str:
    """The recorded digest of an object from its parts' raw SHA-256 digests (see module docstring)."""
    if not part_digests:
        raise ValueError("an object has at least one part")
    if len(part_digests) == 1:
        return part_digests[0].hex()
    return f"{hashlib.sha256(b''.join(part_digests)).hexdigest()}-{len(part_digests)}"


def object_digest(data: bytes | bytearray | memoryview, chunking: Chunking) -> str:
    """The recorded digest of `data` stored with `chunking` (serially; the stores hash parts in parallel)."""
    view = memoryview(data)
    return combine([part_digest(view[a:b]) for a, b in chunking.part_ranges(len(view))])


def from_s3_checksum(value: str) -> str:
    """S3's base64 `ChecksumSHA256` (`b64` or composite `b64-N`) in our hex form."""
    b64, sep, count = value.partition("-")
    hex_digest = base64.b64decode(b64).hex()
    return f"{hex_digest}-{count}" if sep else hex_digest


def to_s3_checksum(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def validate_digest(value: str) -> str:
    if not isinstance(value, str) or not _DIGEST.match(value):
        raise ValueError(f"not a SHA-256 object digest (64 hex digits, optional -N): {value!r}")
    return value
