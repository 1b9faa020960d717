"""What a restore may trust: the manifest the supervisor's log committed, pinned by its SHA-256.

The chain of trust for a restore is: the CheckpointCommitted record (in the supervisor's event
log, written by the leader only) names the manifest's SHA-256; the manifest names every object's
size and SHA-256, DCP's `.metadata` included; the objects hold the tensors. A reader checks each
link before it uses the next: the manifest's bytes against the committed digest before decoding
them, each object against the manifest before any byte is deserialized (dcp.ObjectStoreReader),
and the only unpickling left (DCP's `.metadata`, BYTE_IO items) then sees bytes the log vouched
for; BYTE_IO items are loaded with `torch.load(weights_only=True)` all the same, since a rank that
wrote a poisoned item before the commit got its digest recorded honestly (dcp.SafeLoadPlanner).
Without the pin, anyone who can write the bucket prefix could replace a manifest and its objects
consistently and run code in every rank at the next restore.
Pure: hashlib only, no I/O.
"""

from __future__ import annotations

import hashlib
import re

from ftsup.checkpoint.errors import CheckpointError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class UntrustedCheckpoint(CheckpointError):
    """What the store holds is not what the log committed (tampered or replaced): nothing was loaded."""


def manifest_sha256(body: bytes | bytearray | memoryview) -> str:
    """The digest CheckpointCommitted records: plain SHA-256 (hex) of the manifest object's bytes."""
    return hashlib.sha256(body).hexdigest()


def validate_manifest_sha256(value: str) -> str:
    if not _SHA256.match(value):
        raise ValueError(f"not a manifest SHA-256 (64 lowercase hex digits): {value!r}")
    return value


def check_manifest(key: str, body: bytes | bytearray | memoryview, expected_sha256: str) -> None:
    """Raises UntrustedCheckpoint unless `body` is the manifest the log committed; before decoding."""
    observed = manifest_sha256(body)
    if observed != expected_sha256:
        raise UntrustedCheckpoint(
            f"manifest {key!r} has SHA-256 {observed}, but the committed record pins {expected_sha256}:"
            " it was replaced or altered after the commit; refusing to restore from it"
        )
