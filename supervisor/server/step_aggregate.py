"""StepAggregate on the wire <-> the core's StepAggregate (per-rank figures as arrays).

The wire form packs per-rank values into arrays and sends each digest once with the positions of
the ranks that reported it (at 12,500 nodes the replicas of a data-parallel job agree: a handful
of distinct digests per step instead of one string per rank). Decoding checks the shape (array
lengths, every rank in exactly one parameter-digest group) and says what is wrong; the values
themselves are checked by admission like any StepReport's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ftsup.common import step_pack
from ftsup.common.step_pack import NO_REPLICA_GROUP
from ftsup.supervisor.core.inputs import DigestRanks, StepAggregate, StepReport
from ftsup.v1 import agent_pb2


class MalformedAggregate(ValueError):
    """A StepAggregate message whose parts do not fit together; the text says which."""


def to_input(node_id: str, message: agent_pb2.StepAggregate) -> StepAggregate:
    """The core input, its figures as arrays straight from the packed fields (no object per rank);
    every report is the sender's own (its node id comes from the stream)."""
    ranks, step_s, compute_s, loss = message.ranks, message.step_time_s, message.compute_time_s, message.loss
    norms, tokens, replica_groups = message.grad_norm, message.tokens, message.replica_groups
    count = len(ranks)
    if count == 0:
        raise MalformedAggregate("a step aggregate with no ranks")
    if not len(step_s) == len(compute_s) == len(loss) == count:
        name, values = next((n, v) for n, v in (("step_time_s", step_s), ("compute_time_s", compute_s),
                                                 ("loss", loss)) if len(v) != count)
        raise MalformedAggregate(f"{name} has {len(values)} values for {count} ranks")
    for name, length in (("grad_norm", len(norms)), ("tokens", len(tokens)), ("replica_groups", len(replica_groups))):
        if length not in (0, count):
            raise MalformedAggregate(f"{name} has {length} values for {count} ranks (or none)")
    # One array per field, each made from the container's list (numpy reads a list several times
    # faster than a protobuf container; at 12,500 aggregates per step these calls are the cost).
    # (one flat list, then rows: numpy reads a flat list about twice as fast as a nested one)
    try:
        ints = np.array([*ranks, *(tokens or _zeros(count)), *(replica_groups or _none(count))],
                        dtype=np.int64).reshape(3, count)
    except OverflowError:  # only tokens (uint64) can pass int64's range; ranks and groups are uint32
        raise MalformedAggregate(f"tokens has a value over {np.iinfo(np.int64).max}") from None
    floats = np.array([*step_s, *compute_s, *loss, *(norms or _nans(count))], dtype=np.float64).reshape(4, count)
    if replica_groups:
        ints[2][ints[2] == NO_REPLICA_GROUP] = -1
    ints.flags.writeable = floats.flags.writeable = False  # (the aggregate's arrays are views of these two)
    groups = ints[2]
    params = _grouped(message.param_digests, count, "param_digests")
    if not (len(params) == 1 and params[0].positions is _positions(count)):  # else: one group, every rank
        covered = np.zeros(count, dtype=np.int64)
        for group in params:
            covered[group.positions] += 1
        if not covered.all():
            raise MalformedAggregate(f"rank {int(ints[0][np.flatnonzero(covered == 0)[0]])} is in no param_digests group")
    grads = message.local_grad_digests
    return StepAggregate(node_id, message.generation, message.step, ints[0], floats[0], floats[1], floats[2],
                         floats[3], ints[1], params, _grouped(grads, count, "local_grad_digests") if grads else (), groups)


@functools.lru_cache(maxsize=64)  # (bounded: counts are the sender's to choose)
def _positions(count: int) -> npt.NDArray[np.int64]:
    """0 .. count-1, shared (read-only): the positions of a digest every rank of an aggregate reported."""
    positions = np.arange(count, dtype=np.int64)
    positions.flags.writeable = False
    return positions


@functools.lru_cache(maxsize=64)  # (bounded: counts are the sender's to choose)
def _zeros(count: int) -> list[int]:
    return [0] * count


@functools.lru_cache(maxsize=64)  # (bounded: counts are the sender's to choose)
def _none(count: int) -> list[int]:
    return [-1] * count


@functools.lru_cache(maxsize=64)  # (bounded: counts are the sender's to choose)
def _nans(count: int) -> list[float]:
    return [math.nan] * count


def report_from_proto(node_id: str, r: agent_pb2.StepReport) -> StepReport:
    """One rank's StepReport as the core input (the node id comes from the stream, never the message)."""
    return StepReport(node_id, r.generation, r.rank, r.step, r.step_time_s, r.compute_time_s, r.loss, r.param_digest,
                      r.grad_norm if r.HasField("grad_norm") else math.nan, r.tokens, r.local_grad_digest,
                      r.replica_group if r.HasField("replica_group") else None)


def to_proto(reports: Sequence[StepReport]) -> agent_pb2.StepAggregate:
    """Core reports (of one generation and step) packed for the wire (common/step_pack.py)."""
    return step_pack.pack([report_to_proto(r) for r in reports])


def report_to_proto(r: StepReport) -> agent_pb2.StepReport:
    message = agent_pb2.StepReport(generation=r.generation, rank=r.rank, step=r.step, step_time_s=r.step_time_s,
                                   compute_time_s=r.compute_time_s, loss=r.loss, param_digest=r.param_digest,
                                   tokens=r.tokens, local_grad_digest=r.local_grad_digest)
    if not math.isnan(r.grad_norm):
        message.grad_norm = r.grad_norm
    if r.replica_group is not None:
        message.replica_group = r.replica_group
    return message


def _grouped(groups: Sequence[agent_pb2.DigestGroup], count: int, name: str) -> tuple[DigestRanks, ...]:
    """The wire's digest groups as the core's; a position past the ranks or in two groups is refused."""
    if len(groups) == 1:
        indexes = list(groups[0].indexes)
        if indexes == _order(count):  # the usual aggregate: one digest, every rank, in order
            return (DigestRanks(groups[0].digest, _positions(count)),)
    grouped = tuple(DigestRanks(g.digest, np.array(list(g.indexes), dtype=np.int64)) for g in groups)
    for group in grouped:
        group.positions.flags.writeable = False
    if not grouped:
        return grouped
    positions = np.concatenate([g.positions for g in grouped])
    if len(positions) and int(positions.max()) >= count:
        raise MalformedAggregate(f"{name}: index {int(positions.max())} is past the {count} ranks")
    taken = np.bincount(positions, minlength=count)
    if (taken > 1).any():
        raise MalformedAggregate(f"{name}: position {int(np.flatnonzero(taken > 1)[0])} is in two groups")
    return grouped


@functools.lru_cache(maxsize=64)  # (bounded: counts are the sender's to choose)
def _order(count: int) -> list[int]:
    return list(range(count))
