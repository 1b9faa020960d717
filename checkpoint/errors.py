"""The checkpoint layer's error hierarchy: what callers catch, and whether trying again can help.

Errors are translated here at the storage boundary (boto3, the file system) and carry the key,
checkpoint or value at fault. `StoreUnavailable` is the only retryable kind; the shells retry it
with the project's Backoff and raise it again, naming the attempts, once the deadline is spent.
"""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """Base of every error raised by trainer.checkpoint."""


class StoreError(CheckpointError):
    """An object-store operation failed in a way retrying will not fix (auth, bad request)."""


class StoreUnavailable(StoreError):
    """The store did not answer, answered 5xx, dropped the connection or was too slow: retryable."""


class ObjectNotFound(StoreError):
    """No object at the key."""


class ObjectExists(StoreError):
    """A conditional create lost: an object already exists at the key (S3 412, O_EXCL EEXIST)."""


class ObjectCorrupt(CheckpointError):
    """An object's size or SHA-256 differs from what was recorded for it."""


class ManifestExists(CheckpointError):
    """The checkpoint was already committed with another manifest: manifests are never overwritten."""


class IncompleteCheckpoint(CheckpointError):
    """Shard reports are missing, duplicated or name objects outside the checkpoint: cannot commit."""


class CheckpointNotCommitted(CheckpointError):
    """A reader asked for a checkpoint that has no valid manifest; readers trust only manifests."""


class ReshardRefused(CheckpointError):
    """The checkpoint cannot be restored into the requested topology; the message says why."""
