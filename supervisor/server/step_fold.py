"""ShardStepFold on the wire -> the core's step aggregates and their fold (issue 14, the leader's side).

A link shard packs its sessions' back-to-back StepAggregates of one step into one message
(common/step_fold_pack.py). Decoded here once: each per-rank array is a view of the message's
bytes (numpy.frombuffer), each node's part a slice of them, and the fold the core decides them as
(Core.step_aggregates) is made from the whole arrays instead of by concatenating the parts. The
parts are what step_aggregate.to_input makes of the same aggregates one by one (equal reports,
digest groups in the order of their first position), so a part the core refuses, or a fold it
declines, is handled exactly as the per-node messages would have been.

The shard packs only well-formed aggregates; a fold that is not (a shard's bug) raises
MalformedAggregate for all its parts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ftsup.common.step_pack import NO_REPLICA_GROUP
from ftsup.supervisor.core.inputs import DigestRanks, StepAggregate
from ftsup.supervisor.server.step_aggregate import MalformedAggregate
from ftsup.v1 import shard_pb2

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


def to_fold(node_ids: Sequence[str], message: shard_pb2.ShardStepFold) -> StepAggregate:
    """The fold (its `segments` name each part's node, one per entry of `node_ids`, the nodes of the
    message's sessions in order, and its end): what the core decides whole (Core.step_fold) with
    no object per part; equal to StepAggregate.fold of its parts (`.parts()`)."""
    counts = _array(message.counts, "<u4", "counts").astype(np.int64)
    if len(counts) == 0 or len(counts) != len(node_ids):
        raise MalformedAggregate(f"a step fold of {len(counts)} parts for {len(node_ids)} sessions")
    if int(counts.min()) < 1:
        raise MalformedAggregate("a step fold with a part of no ranks")
    ends = np.cumsum(counts)
    total = int(ends[-1])
    ints: Ints = np.empty((3, total), dtype=np.int64)
    ints[0] = _sized(message.ranks, "<u4", "ranks", total)
    tokens = message.tokens
    ints[1] = _sized(tokens, "<u8", "tokens", total) if tokens else 0
    groups = message.replica_groups
    if groups:
        ints[2] = _sized(groups, "<u4", "replica_groups", total)
        ints[2][ints[2] == NO_REPLICA_GROUP] = -1
    else:
        ints[2] = -1
    ints.flags.writeable = False
    step_s = _floats(message.step_time_s, "step_time_s", total)
    compute_s = _floats(message.compute_time_s, "compute_time_s", total)
    loss = _floats(message.loss, "loss", total)
    if message.grad_norm:
        norms = _floats(message.grad_norm, "grad_norm", total)
    else:
        norms = np.full(total, np.nan)
        norms.flags.writeable = False
    params = _groups(message.param_digests, total, "param_digests")
    covered = np.bincount(np.concatenate([g.positions for g in params]), minlength=total) if params else None
    if covered is None or len(covered) != total or not (covered == 1).all():
        raise MalformedAggregate("param_digests: not every position is in exactly one group")
    grads = _groups(message.local_grad_digests, total, "local_grad_digests")
    if grads and (np.bincount(np.concatenate([g.positions for g in grads]), minlength=total) > 1).any():
        raise MalformedAggregate("local_grad_digests: a position is in two groups")
    ranks, tokens_, groups_ = ints
    return StepAggregate(node_ids[0], message.generation, message.step, ranks, step_s, compute_s, loss, norms,
                         tokens_, params, grads, groups_, tuple(zip(node_ids, ends.tolist())))


def _array(data: bytes, dtype: str, name: str) -> npt.NDArray[np.generic]:
    item = np.dtype(dtype).itemsize
    if len(data) % item:
        raise MalformedAggregate(f"{name}: {len(data)} bytes is not a whole number of {dtype} values")
    return np.frombuffer(data, dtype=dtype)


def _sized(data: bytes, dtype: str, name: str, total: int) -> npt.NDArray[np.generic]:
    """`data` as `total` values (read-only: a view of the message's bytes), native byte order."""
    values = _array(data, dtype, name)
    if len(values) != total:
        raise MalformedAggregate(f"{name} has {len(values)} values for {total} ranks")
    native = values.astype(values.dtype.newbyteorder("="), copy=False)
    native.flags.writeable = False
    return native


def _floats(data: bytes, name: str, total: int) -> Floats:
    """`data` (<f8) as `total` float64s: a read-only view of the message's bytes on a little-endian host."""
    values = _array(data, "<f8", name)
    if len(values) != total:
        raise MalformedAggregate(f"{name} has {len(values)} values for {total} ranks")
    floats: Floats = values.astype(np.float64, copy=False)
    floats.flags.writeable = False
    return floats


def _groups(groups: Sequence[shard_pb2.PackedDigests], total: int, name: str) -> tuple[DigestRanks, ...]:
    out = []
    for group in groups:
        positions = _array(group.positions, "<u4", name).astype(np.int64)
        if len(positions) and int(positions.max()) >= total:
            raise MalformedAggregate(f"{name}: position {int(positions.max())} is past the {total} ranks")
        positions.flags.writeable = False
        out.append(DigestRanks(group.digest, positions))
    return tuple(out)
