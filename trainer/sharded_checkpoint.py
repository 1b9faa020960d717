"""A Session's object-store checkpoint of named state: sharded through DCP, restorable at any world.

Modules and optimizers (their state dicts as torch's distributed state-dict API gives them:
DTensor shards under FSDP2/TP, plain tensors under DDP) are saved through DCP, which records each
shard's place in the global tensor, so a checkpoint written by W ranks loads into W' ranks: each
rank reads the saved chunks its new shards overlap. Everything else of the rank's snapshot (RNG
state, `Stateful` objects such as a data loader, `extra`, the step) travels as one per-rank
payload hashed like a RAM snapshot. checkpoint/supervised.py owns the object layout; this module
owns which part of a state goes where.
"""

from __future__ import annotations

from typing import Any

from ftsup.checkpoint import supervised
from ftsup.checkpoint.manifest import Layout, ShardReport
from ftsup.checkpoint.store import ObjectStore
from ftsup.trainer import snapshot as snap
from ftsup.trainer import state as state_module
from ftsup.trainer.snapshot import RestoredState, SnapshotCorrupt

_SHARDED = (state_module.Kind.MODULE, state_module.Kind.OPTIMIZER)


def _split(objects: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    sharded = {n: o for n, o in objects.items() if state_module.kind_of(n, o) in _SHARDED}
    return sharded, {n: o for n, o in objects.items() if n not in sharded}


def save(store: ObjectStore, layout: Layout, checkpoint_id: str, rank: int, step: int, objects: dict[str, Any],
         extra: Any = None) -> ShardReport:
    """Collective: write this rank's part of the checkpoint of `step` (nothing committed)."""
    sharded, local = _split(objects)
    tensors = state_module.collect(sharded)
    payload, sha256 = snap.encode(snap.build_objects_state(step, state_module.collect(local), extra))
    return supervised.save_sharded(store, layout, checkpoint_id, rank, tensors, payload, sha256)


def load(store: ObjectStore, layout: Layout, checkpoint_id: str, rank: int, world_size: int,
         objects: dict[str, Any], *, manifest_sha256: str = "") -> RestoredState:
    """Restore `objects` and the RNGs from a committed checkpoint, resharded to this world if needed;
    the manifest must have the SHA-256 the supervisor committed (when it recorded one)."""
    sharded, local = _split(objects)
    template = state_module.collect(sharded)  # the live layout: DCP fills it, shard by shard
    payload, sha256, _saved_world = supervised.load_sharded(store, layout, checkpoint_id, rank, world_size, template,
                                                              manifest_sha256=manifest_sha256)
    state = snap.decode(payload, sha256)
    if state.get("format") != snap.FORMAT_VERSION:
        raise SnapshotCorrupt(f"checkpoint {checkpoint_id!r} holds a local payload of format {state.get('format')!r}")
    state_module.apply(sharded, template)
    return snap.apply_objects(state, local)
