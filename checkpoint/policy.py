"""What to delete (retention) and how to restore into a topology (resharding rules). Pure.

Retention keeps the newest K committed checkpoints and deletes incomplete attempts only when they
are provably abandoned: older (by step) than the newest commit and not the attempt in flight. An
attempt newer than every commit may be another writer's, still running: it is left alone.
Unfinished uploads (S3 multipart uploads, local temp files) of crashed writers are aborted once
older than a threshold, inside a checkpoint directory, and not of a checkpoint in flight: the store
cannot tell a live upload from an abandoned one, so age is the evidence (`plan_stale_uploads`).

Restore rules, in order: the data and tokenizer versions must match (a data cursor or a
vocabulary from another data set would silently corrupt training); the same topology loads
directly; another topology goes through DCP's resharding when the saved layout allows it
(replicated and DTensor state map onto any mesh; manually sharded state only when tp and pp are
unchanged), and is refused otherwise with a message saying which dimension blocks it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ftsup.checkpoint.errors import ReshardRefused
from ftsup.checkpoint.manifest import Layout, Manifest, Sharding, Topology, Versions, step_of
from ftsup.checkpoint.store import PendingUpload

DEFAULT_UPLOAD_MAX_AGE_S = 3600.0  # an upload this old is a crashed writer's, not a slow one's


@dataclass(frozen=True, slots=True)
class UploadVerdict:
    """What retention does with one unfinished upload, and why."""

    upload: PendingUpload
    is_stale: bool  # True: abort it
    reason: str


@dataclass(frozen=True, slots=True)
class GcPlan:
    delete_committed: tuple[str, ...]
    delete_incomplete: tuple[str, ...]
    kept: tuple[str, ...]
    uploads: tuple[UploadVerdict, ...] = ()  # filled by catalog.gc from plan_stale_uploads

    @property
    def aborted_uploads(self) -> tuple[PendingUpload, ...]:
        return tuple(v.upload for v in self.uploads if v.is_stale)


def plan_gc(committed: Sequence[tuple[str, int]], attempts: Sequence[str], keep_last: int,
            in_flight: frozenset[str] = frozenset()) -> GcPlan:
    """`committed`: (checkpoint id, step) of every committed checkpoint; `attempts`: ids without a manifest."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (never delete the newest checkpoint), got {keep_last}")
    ordered = sorted(committed, key=lambda c: (c[1], c[0]))
    kept = ordered[-keep_last:]
    doomed = [cid for cid, _ in ordered[:-keep_last] if cid not in in_flight]
    newest_step = ordered[-1][1] if ordered else None
    incomplete = []
    for cid in attempts:
        step = step_of(cid)
        if cid in in_flight or step is None or newest_step is None:
            continue  # unknown age, or nothing committed yet: cannot prove it abandoned
        if step <= newest_step:
            incomplete.append(cid)
    return GcPlan(tuple(doomed), tuple(sorted(incomplete)), tuple(cid for cid, _ in kept))


def plan_stale_uploads(uploads: Sequence[PendingUpload], layout: Layout, older_than_s: float, now_unix_s: float,
                       in_flight: frozenset[str] = frozenset()) -> tuple[UploadVerdict, ...]:
    """Which unfinished uploads under `layout` to abort: inside a checkpoint's directory, named as
    ours are (never someone else's keys sharing the bucket), not of a checkpoint in flight, and started at least
    `older_than_s` before `now_unix_s`. Aborting never touches a stored object, so the worst a
    wrong guess does is fail a live writer's put, which aborts its attempt: never a half commit."""
    if not older_than_s >= 0:
        raise ValueError(f"older_than_s must be >= 0, got {older_than_s!r}")
    verdicts = []
    for upload in uploads:
        cid = layout.checkpoint_of(upload.key)
        age_s = now_unix_s - upload.initiated_unix_s
        if cid is None or step_of(cid) is None:  # ids we write start step-NNNNNNNNNN-: a shared bucket's
            verdicts.append(UploadVerdict(upload, False, f"{upload.key!r} is not inside a checkpoint directory"
                                                         f" (step-NNNNNNNNNN-*) under {layout.root()!r}"))
        elif cid in in_flight:
            verdicts.append(UploadVerdict(upload, False, f"checkpoint {cid!r} is in flight"))
        elif age_s < older_than_s:
            verdicts.append(UploadVerdict(upload, False, f"started {age_s:.0f}s ago, younger than {older_than_s:g}s"))
        else:
            verdicts.append(UploadVerdict(upload, True, f"started {age_s:.0f}s ago (>= {older_than_s:g}s), checkpoint"
                                                        f" {cid!r} not in flight"))
    return tuple(verdicts)


class RestoreMode(enum.Enum):
    DIRECT = "direct"  # same topology: every rank reads back its own shards
    RESHARD = "reshard"  # another topology: DCP maps the saved shards onto the new layout


@dataclass(frozen=True, slots=True)
class RestorePlan:
    mode: RestoreMode
    reason: str


def plan_restore(manifest: Manifest, target: Topology, versions: Versions) -> RestorePlan:
    """How `manifest`'s checkpoint loads into `target`; ReshardRefused saying why when it cannot."""
    saved = manifest.topology
    cid = manifest.checkpoint_id
    if manifest.versions.data_version != versions.data_version:
        raise ReshardRefused(
            f"checkpoint {cid!r} was saved with data version {manifest.versions.data_version!r}, this job"
            f" uses {versions.data_version!r}: its data cursor would point into another data set")
    if manifest.versions.tokenizer_version != versions.tokenizer_version:
        raise ReshardRefused(
            f"checkpoint {cid!r} was saved with tokenizer {manifest.versions.tokenizer_version!r}, this job"
            f" uses {versions.tokenizer_version!r}: embeddings would not match the token ids")
    if saved.sharding is not target.sharding:
        raise ReshardRefused(
            f"checkpoint {cid!r} holds {saved.sharding.value} state, the job expects {target.sharding.value}:"
            " DCP does not convert between layouts")
    same = (saved.world_size, saved.dp, saved.tp, saved.pp) == (target.world_size, target.dp, target.tp, target.pp)
    if same:
        return RestorePlan(RestoreMode.DIRECT, f"same topology, {saved.describe()}")
    if saved.sharding is Sharding.MANUAL and (saved.tp, saved.pp) != (target.tp, target.pp):
        raise ReshardRefused(
            f"checkpoint {cid!r} is manually sharded for tp {saved.tp} pp {saved.pp}; the job runs tp {target.tp}"
            f" pp {target.pp}: per-rank tensor shapes depend on that layout and DCP cannot map them")
    return RestorePlan(RestoreMode.RESHARD,
                       f"resharding through DCP from {saved.describe()} to {target.describe()}")
