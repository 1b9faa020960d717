"""A rank's part in the supervisor's object-store checkpoints: when, writing its shards, reading them back.

Owns the third rung of the recovery ladder on the trainer side: whether a step is a checkpoint
step (the cadence every rank knows, plus steps the supervisor requested off it, which reach each
rank with its agent's answers to step reports and are agreed with one all-reduce), writing this
rank's shards through DCP (trainer/sharded_checkpoint.py) and restoring from the checkpoint the
supervisor named. The store is opened on first use. A failed write is reported, never raised.
"""

from __future__ import annotations

import threading
from typing import Any

from ftsup.checkpoint import supervised
from ftsup.checkpoint.manifest import Layout
from ftsup.checkpoint.store import ObjectStore
from ftsup.checkpoint.supervised import CheckpointEnv
from ftsup.common import checkpoint_ids
from ftsup.trainer import collective, sharded_checkpoint
from ftsup.trainer import snapshot as snap
from ftsup.trainer.snapshot import RestoredState, SnapshotCorrupt
from ftsup.v1 import agent_pb2

_NO_REQUEST = (1 << 62)  # "no requested step known": larger than any step, exact in an int64


class Checkpoints:
    """One rank's checkpoint plan and store (FTSUP_CHECKPOINT_*; off when no location is set)."""

    def __init__(self, env: CheckpointEnv) -> None:
        self.env = env
        self._store: tuple[ObjectStore, Layout] | None = None
        self._lock = threading.Lock()  # the report thread adds requested steps
        self._requested_steps: set[int] = set()

    def is_due(self, step: int) -> bool:
        """Collective when a location is configured; see `Session.checkpoint_due`."""
        if not self.env.location:
            return False
        with self._lock:
            self._requested_steps = {s for s in self._requested_steps if s >= step}
            known = min(self._requested_steps, default=_NO_REQUEST)
        agreed = collective.agree_on_min(known)
        return checkpoint_ids.is_due(step, self.env.every_steps) or agreed == step

    def note_requested(self, after_step: int, steps: list[int]) -> None:
        """Steps the supervisor asked for (from a step report's answer), those after `after_step`."""
        if steps:
            with self._lock:
                self._requested_steps.update(s for s in steps if s > after_step)

    def save(self, generation: int, rank: int, step: int, objects: dict[str, Any], extra: Any) -> agent_pb2.CheckpointShard:
        """Collective: writes this rank's shards; returns the report (with `error` set on a failure)."""
        checkpoint_id = checkpoint_ids.checkpoint_id_for(step, generation)
        shard = agent_pb2.CheckpointShard(generation=generation, rank=rank, checkpoint_id=checkpoint_id, step=step)
        try:
            store, layout = self._open()
            report = sharded_checkpoint.save(store, layout, checkpoint_id, rank, step, objects, extra)
            shard.key, shard.sha256, shard.size_bytes = report.key, report.sha256, report.size_bytes
        except Exception as exc:
            shard.error = f"{type(exc).__name__}: {exc}"[:2000]
        return shard

    def restore(self, expected: int, rank: int, world_size: int, objects: dict[str, Any],
                replicated: bool) -> RestoredState:
        """This rank's state from the committed checkpoint the supervisor named (FTSUP_RESTORE_CHECKPOINT).
        Per rank, not collective: ranks whose RAM copies survived restore from RAM meanwhile."""
        checkpoint_id = self.env.restore_checkpoint_id
        store, layout = self._open()
        manifest_sha256 = self.env.restore_manifest_sha256
        if supervised.is_sharded(store, layout, checkpoint_id, manifest_sha256=manifest_sha256):
            restored = sharded_checkpoint.load(store, layout, checkpoint_id, rank, world_size, objects,
                                               manifest_sha256=manifest_sha256)
        else:  # a per-rank checkpoint of an earlier version: same world size only
            payload, sha256 = supervised.load_rank(store, layout, checkpoint_id, rank, world_size,
                                                   replicated=replicated, manifest_sha256=manifest_sha256)
            restored = snap.apply_objects(snap.decode(payload, sha256), objects)
        if restored.step != expected:
            raise SnapshotCorrupt(f"checkpoint {checkpoint_id!r} holds step {restored.step}, FTSUP_RESTORE_STEP={expected}")
        return restored

    def _open(self) -> tuple[ObjectStore, Layout]:
        if self._store is None:
            self._store = self.env.open()
        return self._store
