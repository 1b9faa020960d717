"""RAM snapshot store: opaque blobs keyed by (rank, step), for this node's ranks and its buddies'.

Owns the bytes held and the retention rule (agent/core/retention.py). Blobs are verified
(SHA-256) before they enter the store, so anything inside it can be handed out unchecked.
No proto imports: the services convert with agent/codec.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass

from agent.core.retention import KEEP_STEPS_PER_RANK, keys_to_drop

SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class InvalidBlob(ValueError):
    """A blob failed validation (empty payload, malformed or mismatched sha256); not retryable."""


@dataclass(frozen=True, slots=True)
class Blob:
    generation: int
    rank: int
    step: int
    owner_node_id: str
    payload: bytes
    sha256: str

    @property
    def key(self) -> tuple[int, int]:
        return (self.rank, self.step)


def verify(blob: Blob) -> None:
    """Raises InvalidBlob unless the payload is non-empty and matches its hex SHA-256."""
    if not blob.payload:
        raise InvalidBlob(f"snapshot rank {blob.rank} step {blob.step}: empty payload")
    claimed = blob.sha256.lower()
    if not SHA256_HEX.fullmatch(claimed):
        raise InvalidBlob(f"snapshot rank {blob.rank} step {blob.step}: sha256 {blob.sha256!r} is not 64 hex digits")
    actual = hashlib.sha256(blob.payload).hexdigest()
    if actual != claimed:
        raise InvalidBlob(
            f"snapshot rank {blob.rank} step {blob.step}: sha256 mismatch (claimed {claimed}, payload has {actual})"
        )


class SnapshotStore:
    """In-memory blobs. Single-threaded (one event loop), so no locking."""

    def __init__(self, keep_per_rank: int = KEEP_STEPS_PER_RANK) -> None:
        self._blobs: dict[tuple[int, int], Blob] = {}
        self._retain_from_step = 0
        self._keep_per_rank = keep_per_rank
        self.bytes_held = 0

    def __len__(self) -> int:
        return len(self._blobs)

    def put(self, blob: Blob) -> None:
        """Stores a verified blob (replacing one at the same key), then applies retention."""
        verify(blob)
        self._put_verified(blob)

    def _put_verified(self, blob: Blob) -> None:
        old = self._blobs.pop(blob.key, None)
        if old is not None:
            self.bytes_held -= len(old.payload)
        self._blobs[blob.key] = blob
        self.bytes_held += len(blob.payload)
        self._prune()

    async def put_off_loop(self, blob: Blob) -> None:
        """`put`, with the SHA-256 check in a worker thread: hashing a model-sized payload takes
        seconds, and on the event loop it would stall heartbeats until the node is declared dead."""
        await asyncio.to_thread(verify, blob)
        self._put_verified(blob)

    def get(self, rank: int, step: int) -> Blob | None:
        return self._blobs.get((rank, step))

    def keys(self) -> list[tuple[int, int]]:
        return sorted(self._blobs)

    def set_retain_from_step(self, step: int) -> None:
        # Taken as given, not max()ed: after a rollback to an older step the floor moves down, and
        # stale directives never get here (the launcher ignores older generations).
        self._retain_from_step = step
        self._prune()

    def _prune(self) -> None:
        for key in keys_to_drop(self._blobs, self._retain_from_step, self._keep_per_rank):
            self.bytes_held -= len(self._blobs.pop(key).payload)
