"""The commit protocol and the catalog of checkpoints in a store: commit, abort, list, gc (with the
stale unfinished uploads of crashed writers).

A checkpoint becomes visible in exactly one step: its manifest is written last, with a put that
never overwrites (S3 `If-None-Match: *`, link(2) locally), and only after every rank's shard index
was read back, matched its reported SHA-256, and every object it lists was found in the store with
the reported size and SHA-256. Readers (`list_committed`, restore) trust nothing but manifests, so
a crash or a failed write at any earlier point leaves an attempt that is invisible and is later
removed by `abort` or `gc`. `commit` is what the supervisor's shell calls once the core has seen
every CheckpointShardWritten; the decisions (which reports, when) stay in the supervisor.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ftsup.checkpoint import digest
from ftsup.checkpoint.errors import (
    CheckpointNotCommitted,
    IncompleteCheckpoint,
    ManifestExists,
    ObjectCorrupt,
    ObjectExists,
    ObjectNotFound,
)
from ftsup.checkpoint.manifest import (
    Layout,
    Manifest,
    ShardIndex,
    ShardReport,
    Topology,
    Versions,
    check_shard_indexes,
    check_shard_reports,
    decode_manifest,
    decode_shard_index,
    encode_manifest,
    encode_shard_index,
    mismatch,
)
from ftsup.checkpoint.policy import DEFAULT_UPLOAD_MAX_AGE_S, GcPlan, UploadVerdict, plan_gc, plan_stale_uploads
from ftsup.checkpoint.store import ObjectInfo, ObjectStore
from ftsup.checkpoint.verify import check_manifest, manifest_sha256

log = logging.getLogger(__name__)


def write_shard_index(store: ObjectStore, layout: Layout, index: ShardIndex) -> ShardReport:
    """Store a rank's shard index after its objects are written; the report goes to the supervisor."""
    info = store.put(layout.shard_index_key(index.checkpoint_id, index.rank), encode_shard_index(index))
    return ShardReport(index.rank, info.key, info.sha256, info.size_bytes)


def _read_index(store: ObjectStore, report: ShardReport, checkpoint_id: str) -> ShardIndex:
    try:
        data = store.get(report.key)
    except ObjectNotFound as exc:
        raise IncompleteCheckpoint(f"checkpoint {checkpoint_id!r}: rank {report.rank}'s shard index"
                                   f" {report.key!r} is missing") from exc
    observed = ObjectInfo(report.key, len(data), digest.object_digest(data, store.chunking))
    problem = mismatch(ObjectInfo(report.key, report.size_bytes, report.sha256), observed)
    if problem:
        raise ObjectCorrupt(f"checkpoint {checkpoint_id!r}: shard index {problem}")
    index = decode_shard_index(bytes(data))
    if index.rank != report.rank:
        raise IncompleteCheckpoint(f"{report.key!r} holds rank {index.rank}'s index, reported as rank {report.rank}")
    return index


def verify(store: ObjectStore, layout: Layout, checkpoint_id: str, reports: Sequence[ShardReport],
           world_size: int, *, max_concurrency: int = 8) -> tuple[ObjectInfo, ...]:
    """Every object of the attempt, each confirmed present with its reported size and SHA-256."""
    reports = check_shard_reports(reports, world_size, checkpoint_id, layout)
    with ThreadPoolExecutor(max_concurrency, thread_name_prefix="ftsup-verify") as pool:
        indexes = list(pool.map(lambda r: _read_index(store, r, checkpoint_id), reports))
        objects = check_shard_indexes(indexes, checkpoint_id, layout)

        def observe(obj: ObjectInfo) -> str | None:
            try:
                return mismatch(obj, store.head(obj.key))
            except ObjectNotFound:
                return f"{obj.key!r} is missing"

        problems = [p for p in pool.map(observe, objects) if p]
    if problems:
        raise ObjectCorrupt(f"checkpoint {checkpoint_id!r} cannot commit: {len(problems)} objects differ from"
                            f" their reports, first: {problems[0]}")
    return objects


def commit(store: ObjectStore, layout: Layout, checkpoint_id: str, step: int, reports: Sequence[ShardReport],
           topology: Topology, versions: Versions) -> Manifest:
    """Verify the attempt and write its manifest, last and only if none exists. Raises, never half-commits."""
    return commit_pinned(store, layout, checkpoint_id, step, reports, topology, versions)[0]


def commit_pinned(store: ObjectStore, layout: Layout, checkpoint_id: str, step: int, reports: Sequence[ShardReport],
                  topology: Topology, versions: Versions) -> tuple[Manifest, str]:
    """commit(), also returning the SHA-256 of the manifest bytes now in the store (the ones this
    call wrote, or the identical commit found there), for the log to pin (verify.py)."""
    objects = verify(store, layout, checkpoint_id, reports, topology.world_size)
    manifest = Manifest(
        checkpoint_id=checkpoint_id, step=step, topology=topology, versions=versions, chunking=store.chunking,
        shards=tuple(sorted(reports, key=lambda r: r.rank)), objects=objects, commit_nonce=uuid.uuid4().hex,
        committed_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
    )
    body = encode_manifest(manifest)
    key = layout.manifest_key(checkpoint_id)
    try:
        store.put_if_absent(key, body)
    except ObjectExists as exc:
        # A retried put whose first answer was lost finds its own manifest, or a new leader after a
        # failover commits again what its predecessor already committed: when the manifest there
        # names exactly these shards, that is this commit (never overwritten either way).
        existing_body = bytes(store.get(key))
        if existing_body != body:
            try:
                existing = decode_manifest(existing_body)
            except ValueError:
                existing = None
            if existing is None or (existing.checkpoint_id, existing.step, existing.shards) != (
                manifest.checkpoint_id, manifest.step, manifest.shards
            ):
                raise ManifestExists(
                    f"checkpoint {checkpoint_id!r} is already committed ({key!r} exists on {store.describe()})"
                    " for another step or other shards; manifests are never overwritten"
                ) from exc
            log.info("checkpoint %s was already committed with these shards (a retry or a new leader)",
                     checkpoint_id)
            return existing, manifest_sha256(existing_body)
    log.info("committed checkpoint %s at step %d: %d objects, %d bytes, %s", checkpoint_id, step,
             len(objects), sum(o.size_bytes for o in objects), topology.describe())
    return manifest, manifest_sha256(body)


def read_manifest(store: ObjectStore, layout: Layout, checkpoint_id: str, *, sha256: str | None = None) -> Manifest:
    """The checkpoint's manifest; CheckpointNotCommitted when it has none or it is invalid.

    `sha256`: the digest the log committed (CheckpointCommitted.manifest_sha256); the bytes are
    checked against it before they are decoded (UntrustedCheckpoint). Restores pass it.
    """
    key = layout.manifest_key(checkpoint_id)
    try:
        body = bytes(store.get(key))
        if sha256 is not None:
            check_manifest(key, body, sha256)
        manifest = decode_manifest(body)
    except ObjectNotFound as exc:
        raise CheckpointNotCommitted(f"checkpoint {checkpoint_id!r} has no manifest on {store.describe()}") from exc
    except ValueError as exc:
        raise CheckpointNotCommitted(f"checkpoint {checkpoint_id!r}: invalid manifest {key!r}: {exc}") from exc
    if manifest.checkpoint_id != checkpoint_id:
        raise CheckpointNotCommitted(f"{key!r} names checkpoint {manifest.checkpoint_id!r}")
    return manifest


@dataclass(frozen=True, slots=True)
class Catalog:
    """The checkpoints under a layout's prefix, as found in the store at one moment."""

    committed: tuple[Manifest, ...]  # valid manifests, oldest step first
    incomplete: tuple[str, ...]  # attempt ids with objects but no valid manifest
    keys: dict[str, tuple[str, ...]]  # checkpoint id -> its keys; built here, never shared mutably
    unreadable: tuple[str, ...] = ()  # of `incomplete`: a manifest is there but this version cannot read it


def scan(store: ObjectStore, layout: Layout) -> Catalog:
    keys: dict[str, list[str]] = {}
    for key in store.list(layout.root()):
        cid = layout.checkpoint_of(key)
        if cid is not None:
            keys.setdefault(cid, []).append(key)
    committed, incomplete, unreadable = [], [], []
    for cid, cid_keys in sorted(keys.items()):
        if layout.manifest_key(cid) not in cid_keys:
            incomplete.append(cid)
            continue
        try:
            committed.append(read_manifest(store, layout, cid))
        except CheckpointNotCommitted as exc:
            log.warning("ignoring checkpoint %s: %s", cid, exc)
            incomplete.append(cid)
            unreadable.append(cid)
    committed.sort(key=lambda m: (m.step, m.checkpoint_id))
    return Catalog(tuple(committed), tuple(incomplete), {k: tuple(v) for k, v in keys.items()}, tuple(unreadable))


def list_committed(store: ObjectStore, layout: Layout) -> tuple[Manifest, ...]:
    """Checkpoints with a valid manifest, oldest step first. Everything else is invisible."""
    return scan(store, layout).committed


def latest_committed(store: ObjectStore, layout: Layout) -> Manifest | None:
    committed = list_committed(store, layout)
    return committed[-1] if committed else None


def abort(store: ObjectStore, layout: Layout, checkpoint_id: str) -> int:
    """Delete an attempt that will not be committed; returns how many objects.

    A manifest found there is retracted first (readers then see the checkpoint whole or gone): it
    is a commit the caller decided against after it was written (the supervisor's core refuses an
    SDC-tainted step, or one no newer than the last commit, once the commit returned), or one whose
    answer was lost until the retries ran out, so the caller was told it failed. Either way the
    caller's record says "not committed", and the store must agree with it. Never call this for a
    checkpoint the caller recorded as committed: retention (gc) deletes those. Abort and commit of
    one attempt must not run concurrently (the commit could write its manifest after the delete).
    """
    keys = store.list(layout.directory(checkpoint_id))
    manifest_key = layout.manifest_key(checkpoint_id)
    if manifest_key in keys:
        log.warning("retracting the manifest of checkpoint %s: its commit was decided against or not"
                    " acknowledged, so it must not stay visible", checkpoint_id)
        store.delete([manifest_key])
    store.delete([k for k in keys if k != manifest_key])
    log.info("aborted checkpoint attempt %s: deleted %d objects", checkpoint_id, len(keys))
    return len(keys)


def abort_stale_uploads(store: ObjectStore, layout: Layout, older_than_s: float = DEFAULT_UPLOAD_MAX_AGE_S,
                        in_flight: frozenset[str] = frozenset(), *, now_unix_s: float | None = None,
                        dry_run: bool = False) -> tuple[UploadVerdict, ...]:
    """Abort the unfinished uploads crashed writers left under the layout (policy.plan_stale_uploads).

    S3 keeps the parts of a multipart upload that was never completed or aborted, and bills them,
    forever; a local writer that died leaves its temp file. Returns every upload seen, with its verdict.
    """
    now = time.time() if now_unix_s is None else now_unix_s
    verdicts = plan_stale_uploads(store.list_uploads(layout.root()), layout, older_than_s, now, in_flight)
    stale = [v for v in verdicts if v.is_stale]
    if not dry_run:
        for verdict in stale:
            store.abort_upload(verdict.upload)
    if stale:
        log.info("%s %d stale uploads under %r on %s: %s", "would abort" if dry_run else "aborted", len(stale),
                 layout.prefix, store.describe(), "; ".join(f"{v.upload.key} ({v.reason})" for v in stale))
    return verdicts


def gc(store: ObjectStore, layout: Layout, keep_last: int, in_flight: frozenset[str] = frozenset(), *,
       uploads_older_than_s: float | None = DEFAULT_UPLOAD_MAX_AGE_S, now_unix_s: float | None = None,
       dry_run: bool = False) -> GcPlan:
    """Retention: keep the newest `keep_last` commits; delete older ones and abandoned attempts, and
    abort stale unfinished uploads (`uploads_older_than_s`; None leaves uploads alone).

    A committed checkpoint loses its manifest first, so a concurrent reader sees it either whole
    or gone, never a manifest pointing at deleted objects. `dry_run` plans without deleting.
    """
    catalog = scan(store, layout)
    # A manifest this version cannot read (a newer format, damage) is no proof of an abandoned attempt.
    attempts = [cid for cid in catalog.incomplete if cid not in catalog.unreadable]
    if catalog.unreadable:
        log.warning("gc under %r keeps %s: their manifests cannot be read here", layout.prefix, list(catalog.unreadable))
    plan = plan_gc([(m.checkpoint_id, m.step) for m in catalog.committed], attempts, keep_last, in_flight)
    if not dry_run:
        for cid in plan.delete_committed:
            manifest_key = layout.manifest_key(cid)
            store.delete([manifest_key])
            store.delete([k for k in catalog.keys[cid] if k != manifest_key])
        for cid in plan.delete_incomplete:
            store.delete(catalog.keys[cid])
    if plan.delete_committed or plan.delete_incomplete:
        log.info("gc under %r: %s committed %s, incomplete %s; kept %s", layout.prefix,
                 "would delete" if dry_run else "deleted", list(plan.delete_committed),
                 list(plan.delete_incomplete), list(plan.kept))
    if uploads_older_than_s is None:
        return plan
    uploads = abort_stale_uploads(store, layout, uploads_older_than_s, in_flight, now_unix_s=now_unix_s,
                                  dry_run=dry_run)
    return dataclasses.replace(plan, uploads=uploads)
