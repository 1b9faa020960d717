"""Save and restore for a training job: DCP through the object store, then commit or refuse.

`save` is the standalone path (tests, benchmarks, jobs without a supervisor): every rank writes its
objects and its shard index, rank 0 gathers the reports and calls catalog.commit, or aborts the
attempt if any rank failed. Under the supervisor the reports travel as CheckpointShardWritten
events instead and the supervisor's shell calls commit. `load` checks the manifest against the
job's topology and versions (policy.plan_restore) before DCP reads a byte.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ftsup.checkpoint.catalog import abort, commit, read_manifest, write_shard_index
from ftsup.checkpoint.dcp import ObjectStoreReader, ObjectStoreWriter
from ftsup.checkpoint.errors import CheckpointError, ManifestExists
from ftsup.checkpoint.manifest import Layout, Manifest, ShardReport, Topology, Versions
from ftsup.checkpoint.policy import RestoreMode, RestorePlan, plan_restore
from ftsup.checkpoint.store import ObjectStore

log = logging.getLogger(__name__)


class CheckpointWriteFailed(CheckpointError):
    """Some rank could not write its shard, or the commit failed: nothing was committed."""


@dataclass(frozen=True, slots=True)
class _RankOutcome:
    rank: int
    report: ShardReport | None
    error: str | None


def _world(process_group: Any) -> tuple[int, int]:
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def _check_world(topology: Topology, world_size: int) -> None:
    if topology.world_size != world_size:
        raise ValueError(f"topology.world_size={topology.world_size} but the process group has {world_size} ranks")


def save(state_dict: dict[str, Any], store: ObjectStore, layout: Layout, checkpoint_id: str, step: int,
         topology: Topology, versions: Versions, *, process_group: Any = None, objects_per_rank: int = 1) -> Manifest:
    """Collective: write this rank's shard, then rank 0 commits. Every rank returns the manifest or raises."""
    rank, world_size = _world(process_group)
    _check_world(topology, world_size)
    writer = ObjectStoreWriter(store, layout, checkpoint_id, objects_per_rank=objects_per_rank)
    outcome: _RankOutcome
    try:
        dcp.save(state_dict, storage_writer=writer, process_group=process_group, no_dist=world_size == 1)
        outcome = _RankOutcome(rank, write_shard_index(store, layout, writer.shard_index()), None)
    except (Exception, CheckpointException) as exc:  # reported to rank 0, which aborts the attempt
        log.warning("rank %d could not write checkpoint %s: %s", rank, checkpoint_id, _describe(exc))
        outcome = _RankOutcome(rank, None, f"rank {rank}: {_describe(exc)}")
    outcomes = _gather(outcome, world_size, process_group)
    result: list[Any] = [None]
    if rank == 0:
        result[0] = _commit_or_abort(store, layout, checkpoint_id, step, outcomes, topology, versions)
    if world_size > 1:
        dist.broadcast_object_list(result, src=dist.get_global_rank(process_group, 0) if process_group else 0,
                                   group=process_group)
    if isinstance(result[0], str):
        raise CheckpointWriteFailed(result[0])
    return result[0]


def _describe(exc: BaseException) -> str:
    """One line per failed rank: DCP wraps the real errors, with tracebacks, in CheckpointException."""
    if isinstance(exc, CheckpointException):
        return "; ".join(f"{type(e).__name__}: {e} (DCP rank {r})" for r, (e, _tb) in sorted(exc.failures.items()))
    return f"{type(exc).__name__}: {exc}"


def _gather(outcome: _RankOutcome, world_size: int, process_group: Any) -> list[_RankOutcome]:
    if world_size == 1:
        return [outcome]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, outcome, group=process_group)
    return gathered


def _commit_or_abort(store: ObjectStore, layout: Layout, checkpoint_id: str, step: int,
                     outcomes: list[_RankOutcome], topology: Topology, versions: Versions) -> Manifest | str:
    errors = [o.error for o in outcomes if o.error]
    if not errors:
        try:
            return commit(store, layout, checkpoint_id, step, [o.report for o in outcomes if o.report],
                          topology, versions)
        except ManifestExists as exc:
            return f"checkpoint {checkpoint_id!r} not committed: {exc}"
        except CheckpointError as exc:
            errors.append(f"commit: {exc}")
    try:
        abort(store, layout, checkpoint_id)
    except CheckpointError as exc:
        errors.append(f"abort: {exc} (gc will remove the attempt)")
    return f"checkpoint {checkpoint_id!r} not committed, attempt aborted: {'; '.join(errors)}"


def load(store: ObjectStore, layout: Layout, checkpoint_id: str, state_dict: dict[str, Any], topology: Topology,
         versions: Versions, *, process_group: Any = None) -> RestorePlan:
    """Collective: fill `state_dict` in place from a committed checkpoint, resharding through DCP if needed.

    Raises CheckpointNotCommitted (no valid manifest) or ReshardRefused (saying why) before reading data.
    """
    _rank, world_size = _world(process_group)
    _check_world(topology, world_size)
    manifest = read_manifest(store, layout, checkpoint_id)
    plan = plan_restore(manifest, topology, versions)
    if plan.mode is RestoreMode.RESHARD:
        log.info("checkpoint %s: %s", checkpoint_id, plan.reason)
    reader = ObjectStoreReader(store, layout, manifest)
    try:
        dcp.load(state_dict, storage_reader=reader, process_group=process_group, no_dist=world_size == 1)
    except CheckpointException as exc:  # a BaseException wrapping each rank's error: surface ours
        causes = [e for _r, (e, _tb) in sorted(exc.failures.items())]
        if causes and isinstance(causes[0], CheckpointError):
            raise causes[0] from exc
        raise CheckpointError(f"restoring {checkpoint_id!r} failed: {_describe(exc)}") from exc
    return plan
