"""Checkpoints of a job run under the ftsup supervisor: what each rank saves, and the topology
and versions the supervisor commits them with.

Each rank saves its modules' and optimizers' state dicts through DCP as they live (DTensor shards
of FSDP2/TP state with their layout, replicated plain tensors once), so DCP can map them onto
another world size at load (`Sharding.DTENSOR`), plus one per-rank item: the rest of its snapshot
payload (RNG state, `Stateful` objects such as a data loader, `extra`), checked by its SHA-256.
Checkpoints of earlier versions hold the whole payload per rank (`Sharding.MANUAL`) and restore
at the same world size only (`load_rank`).
The supervisor's shell imports this module for `job_topology`/`JOB_VERSIONS`, so the commit
and the trainers' loads agree without asking each other.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ftsup.checkpoint.errors import CheckpointError, ReshardRefused
from ftsup.checkpoint.location import open_location
from ftsup.checkpoint.manifest import Layout, Sharding, ShardReport, Topology, Versions
from ftsup.checkpoint.store import ObjectStore
from ftsup.checkpoint.verify import validate_manifest_sha256

log = logging.getLogger(__name__)

JOB_VERSIONS = Versions(data_version="ftsup-job", tokenizer_version="ftsup-job")


def job_topology(world_size: int) -> Topology:
    return Topology(world_size=world_size, dp=world_size, sharding=Sharding.DTENSOR)





def _payload_key(rank: int) -> str:
    return f"rank-{rank:05d}-payload"


def _sha_key(rank: int) -> str:
    return f"rank-{rank:05d}-sha256"


@dataclass(frozen=True, slots=True)
class CheckpointEnv:
    """FTSUP_CHECKPOINT_* as set by the supervisor (location empty: checkpoints are off).

    `read_timeout_s` and `retry_deadline_s` are the trainer's own store settings (None: the
    store's defaults, 60 s and 120 s); a training script sets them from its flags (the example
    trainer's --checkpoint-read-timeout-s / --checkpoint-retry-deadline-s), never the environment.
    """

    location: str
    every_steps: int
    endpoint_url: str
    region: str
    restore_checkpoint_id: str  # FTSUP_RESTORE_CHECKPOINT: restore from this committed checkpoint
    # FTSUP_RESTORE_CHECKPOINT_SHA256: its manifest's digest as the log committed it ("" from a
    # supervisor that predates the pin: the manifest is then trusted as found, with a warning)
    restore_manifest_sha256: str = ""
    read_timeout_s: float | None = None
    retry_deadline_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("read_timeout_s", "retry_deadline_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"CheckpointEnv.{name} must be > 0, got {value!r}")
        if self.restore_manifest_sha256:
            validate_manifest_sha256(self.restore_manifest_sha256)

    @classmethod
    def from_mapping(cls, env: Mapping[str, str]) -> CheckpointEnv:
        raw = env.get("FTSUP_CHECKPOINT_EVERY_STEPS", "") or "0"
        try:
            every = int(raw)
        except ValueError:
            raise ValueError(f"FTSUP_CHECKPOINT_EVERY_STEPS={raw!r} is not an integer") from None
        if every < 0:
            raise ValueError(f"FTSUP_CHECKPOINT_EVERY_STEPS={every} must be >= 0")
        return cls(env.get("FTSUP_CHECKPOINT_LOCATION", ""), every, env.get("FTSUP_CHECKPOINT_ENDPOINT", ""),
                   env.get("FTSUP_CHECKPOINT_REGION", ""), env.get("FTSUP_RESTORE_CHECKPOINT", ""),
                   restore_manifest_sha256=env.get("FTSUP_RESTORE_CHECKPOINT_SHA256", ""))

    def open(self) -> tuple[ObjectStore, Layout]:
        if not self.location:
            raise ValueError("FTSUP_CHECKPOINT_LOCATION is not set: no checkpoint store configured")
        return open_location(self.location, endpoint_url=self.endpoint_url or None, region=self.region or None,
                             read_timeout_s=self.read_timeout_s, retry_deadline_s=self.retry_deadline_s)


def _dcp_error(what: str, exc: Any) -> CheckpointError:
    """DCP's CheckpointException (a BaseException wrapping each rank's error) as one CheckpointError: the first cause when it is
    ours (StoreUnavailable stays StoreUnavailable), naming every failed rank."""
    causes = sorted(exc.failures.items())
    described = "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, (e, _tb) in causes)
    first = causes[0][1][0] if causes else None
    kind = type(first) if isinstance(first, CheckpointError) else CheckpointError
    return kind(f"{what} failed: {described or exc}")


def save_rank(store: ObjectStore, layout: Layout, checkpoint_id: str, rank: int, payload: bytes,
              sha256: str) -> ShardReport:
    """Collective (every rank of the default process group): write this rank's shard and its
    shard index; returns the report for the supervisor. Nothing is committed here."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from ftsup.checkpoint.catalog import write_shard_index
    from ftsup.checkpoint.dcp import ObjectStoreWriter

    writer = ObjectStoreWriter(store, layout, checkpoint_id)
    state = {_payload_key(rank): payload, _sha_key(rank): sha256}
    try:
        dcp.save(state, storage_writer=writer, no_dist=not dist.is_initialized())
    except CheckpointException as exc:
        # DCP raises a BaseException on every rank when any rank's write failed: as is, it would
        # escape callers' `except Exception` and kill a trainer whose write should just be reported.
        raise _dcp_error(f"writing checkpoint {checkpoint_id!r}", exc) from exc
    return write_shard_index(store, layout, writer.shard_index())


def load_rank(store: ObjectStore, layout: Layout, checkpoint_id: str, rank: int, world_size: int,
              *, replicated: bool = False, manifest_sha256: str = "") -> tuple[bytes, str]:
    """This rank's payload and its SHA-256 from a committed checkpoint. Not collective: ranks
    whose RAM copies survived restore from RAM meanwhile. The manifest is checked first (the
    topology and versions must allow the restore) and every object against it before use.
    `replicated`: every rank holds the same state (an elastic job), so a rank beyond the saved
    world (the job grew) loads rank `rank % saved world`'s payload. `manifest_sha256`: the digest
    the log committed (verify.py); without it the manifest is trusted as found (logged)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from ftsup.checkpoint.catalog import read_manifest
    from ftsup.checkpoint.dcp import ObjectStoreReader, SafeLoadPlanner
    from ftsup.checkpoint.policy import plan_restore

    if not manifest_sha256:
        log.warning("restoring checkpoint %s without a committed manifest digest (a supervisor older than"
                    " the pin): the manifest is trusted as found in the store", checkpoint_id)
    manifest = read_manifest(store, layout, checkpoint_id, sha256=manifest_sha256 or None)
    # Committed as MANUAL by earlier supervisors, as DTENSOR by this one: the payloads decide.
    target = Topology(world_size=world_size, dp=world_size, sharding=manifest.topology.sharding)
    plan_restore(manifest, target, JOB_VERSIONS)  # raises ReshardRefused, saying why
    saved_world = manifest.topology.world_size
    if rank >= saved_world:
        if not replicated:
            raise ReshardRefused(f"checkpoint {checkpoint_id!r} was saved by {saved_world} rank(s): rank {rank}"
                                 " has no shard (only an elastic job's replicated state can borrow another's)")
        rank = rank % saved_world
    elif saved_world != world_size and not replicated:
        raise ReshardRefused(f"checkpoint {checkpoint_id!r} holds one opaque payload per rank of {saved_world}"
                             f" rank(s): it restores at that world size only, not {world_size}")
    state: dict[str, object] = {_payload_key(rank): b"", _sha_key(rank): ""}
    try:
        reader = ObjectStoreReader(store, layout, manifest)
        reader.verified_metadata()  # its refusals as raised, not wrapped by DCP
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    except CheckpointException as exc:
        raise _dcp_error(f"reading rank {rank} of checkpoint {checkpoint_id!r}", exc) from exc
    payload, sha = state[_payload_key(rank)], state[_sha_key(rank)]
    if not isinstance(payload, bytes) or not isinstance(sha, str) or not payload:
        raise ValueError(f"checkpoint {checkpoint_id!r} holds no payload for rank {rank}")
    return payload, sha


def _local_key(rank: int) -> str:
    return f"rank-{rank:05d}-local"


def _local_sha_key(rank: int) -> str:
    return f"rank-{rank:05d}-local-sha256"


def is_sharded(store: ObjectStore, layout: Layout, checkpoint_id: str, *, manifest_sha256: str = "") -> bool:
    """Was the committed checkpoint written by `save_sharded` (False: one payload per rank, as
    earlier versions wrote)? Its DCP metadata (checked against the manifest) lists the items."""
    from ftsup.checkpoint.catalog import read_manifest
    from ftsup.checkpoint.dcp import ObjectStoreReader

    manifest = read_manifest(store, layout, checkpoint_id, sha256=manifest_sha256 or None)
    return _local_key(0) in ObjectStoreReader(store, layout, manifest).read_metadata().state_dict_metadata


def save_sharded(store: ObjectStore, layout: Layout, checkpoint_id: str, rank: int, tensors: dict[str, Any],
                 local_payload: bytes, local_sha256: str) -> ShardReport:
    """Collective (every rank of the default process group): DCP-save `tensors` (state dicts as they
    live: DTensor shards, replicated plain tensors written once) and this rank's `local_payload`;
    returns the report for the supervisor. Nothing is committed here."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from ftsup.checkpoint.catalog import write_shard_index
    from ftsup.checkpoint.dcp import ObjectStoreWriter

    reserved = {k for k in tensors if k.startswith("rank-")}
    if reserved:
        raise ValueError(f"state names {sorted(reserved)} clash with the per-rank items (rank-NNNNN-*)")
    writer = ObjectStoreWriter(store, layout, checkpoint_id)
    state = {**tensors, _local_key(rank): local_payload, _local_sha_key(rank): local_sha256}
    try:
        dcp.save(state, storage_writer=writer, no_dist=not dist.is_initialized())
    except CheckpointException as exc:
        raise _dcp_error(f"writing checkpoint {checkpoint_id!r}", exc) from exc
    return write_shard_index(store, layout, writer.shard_index())


def load_sharded(store: ObjectStore, layout: Layout, checkpoint_id: str, rank: int, world_size: int,
                 template: dict[str, Any], *, manifest_sha256: str = "") -> tuple[bytes, str, int]:
    """Fill `template` (state dicts laid out as this job's live ones) in place from a committed
    `save_sharded` checkpoint, resharding through DCP when the world changed; returns this rank's
    local payload, its SHA-256 and the saved world size. Not collective: each rank reads the
    chunks its own shards overlap. A rank beyond the saved world gets rank `rank % saved world`'s
    local payload (its RNG and data position are another rank's: docs/state.md)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from ftsup.checkpoint.catalog import read_manifest
    from ftsup.checkpoint.dcp import ObjectStoreReader
    from ftsup.checkpoint.policy import plan_restore

    manifest = read_manifest(store, layout, checkpoint_id, sha256=manifest_sha256 or None)  # the pin first
    plan_restore(manifest, job_topology(world_size), JOB_VERSIONS)  # raises ReshardRefused, saying why
    saved_world = manifest.topology.world_size
    source = rank % saved_world
    state = {**template, _local_key(source): b"", _local_sha_key(source): ""}
    try:
        dcp.load(state, storage_reader=ObjectStoreReader(store, layout, manifest), no_dist=True)
    except CheckpointException as exc:
        raise _dcp_error(f"reading rank {rank} of checkpoint {checkpoint_id!r}", exc) from exc
    payload, sha = state[_local_key(source)], state[_local_sha_key(source)]
    if not isinstance(payload, bytes) or not isinstance(sha, str) or not payload:
        raise ValueError(f"checkpoint {checkpoint_id!r} holds no local payload for rank {source}")
    template.update({k: state[k] for k in template})
    return payload, sha, saved_world
