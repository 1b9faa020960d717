"""The checkpoint invariant checked in the store itself, not only in the event log.

A committed checkpoint is lost when the log committed it among the newest `keep` (what retention
keeps) and the store has no valid manifest for it; it is half-visible when the store shows a
manifest that names an object which is missing or whose bytes differ from the recorded size and
SHA-256, or a manifest the log never committed (a reader trusts manifests: it would restore a
checkpoint the supervisor does not know). Objects are read back and hashed, not HEADed: the
stored checksum could be right while the bytes are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ftsup.checkpoint import digest
from ftsup.checkpoint.errors import ObjectNotFound
from ftsup.checkpoint.manifest import MANIFEST_NAME, Layout, decode_manifest
from ftsup.checkpoint.store import ObjectStore, PendingUpload
from ftsup.harness.chaos.checks import of_kind
from ftsup.v1 import events_pb2


@dataclass(frozen=True, slots=True)
class StoreView:
    """What the checkpoint store holds at the end of a run, and what is wrong with it."""

    keys: tuple[str, ...]  # every object under the layout's root
    uploads: tuple[PendingUpload, ...]  # unfinished uploads left under it
    manifests: tuple[str, ...]  # checkpoint ids with a manifest, sorted
    problems: tuple[str, ...]  # one line per lost or half-visible checkpoint finding
    lost: int  # checkpoints those findings concern


def inspect_store(store: ObjectStore, layout: Layout, records: Sequence[events_pb2.Record], keep: int) -> StoreView:
    keys = store.list(layout.root())
    manifest_ids = sorted({cid for k in keys if (cid := layout.checkpoint_of(k)) and k == layout.manifest_key(cid)})
    committed = of_kind(records, "checkpoint_committed")
    committed_ids = {c.checkpoint_id for c in committed}
    bad: dict[str, str] = {}
    for cid in manifest_ids:
        problem = _manifest_problem(store, layout, cid)
        if problem is None and cid not in committed_ids:
            problem = f"checkpoint {cid} has a manifest in the store, but the log never committed it"
        if problem is not None:
            bad[cid] = problem
    newest = sorted(committed, key=lambda c: (c.step, c.checkpoint_id))[-keep:] if keep > 0 else []
    for c in newest:
        if c.checkpoint_id not in manifest_ids:
            bad[c.checkpoint_id] = (f"checkpoint {c.checkpoint_id} (step {c.step}) was committed and is among the"
                                    f" newest {keep}, but the store has no manifest for it")
    return StoreView(keys, store.list_uploads(layout.root()), tuple(manifest_ids),
                     tuple(bad[cid] for cid in sorted(bad)), len(bad))


def _manifest_problem(store: ObjectStore, layout: Layout, checkpoint_id: str) -> str | None:
    """Why the checkpoint's manifest is not a whole checkpoint, or None when it is."""
    try:
        manifest = decode_manifest(bytes(store.get(layout.manifest_key(checkpoint_id))))
    except ObjectNotFound:
        return None  # deleted by retention since the listing: gone whole, manifest first
    except ValueError as exc:
        return f"checkpoint {checkpoint_id}: {MANIFEST_NAME} is not a valid manifest ({exc})"
    if manifest.checkpoint_id != checkpoint_id:
        return f"checkpoint {checkpoint_id}: its manifest names checkpoint {manifest.checkpoint_id}"
    for obj in manifest.objects:
        try:
            data = store.get(obj.key)
        except ObjectNotFound:
            if not store.list(layout.manifest_key(checkpoint_id)):
                return None  # retention deleted it meanwhile (manifest first): gone whole
            return f"checkpoint {checkpoint_id} is half-visible: its manifest names {obj.key}, which is missing"
        observed = digest.object_digest(data, manifest.chunking)
        if (len(data), observed) != (obj.size_bytes, obj.sha256):
            return (f"checkpoint {checkpoint_id} is half-visible: {obj.key} is {len(data)} bytes with SHA-256"
                    f" {observed}; the manifest records {obj.size_bytes} bytes, {obj.sha256}")
    return None
