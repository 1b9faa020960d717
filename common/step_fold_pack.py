"""Several sessions' StepAggregates of one step packed into one ShardStepFold (issue 14, a link shard's side).

A shard's nodes report a step within milliseconds of each other, so its batch to the leader holds
their aggregates back to back; packed, the leader handles one message per shard per step instead
of one per node, and decodes it with numpy views (supervisor/server/step_fold.py). The packing
decides nothing: the arrays are the parts' concatenated in order, the digests grouped by value
exactly as the leader's own fold groups its parts' (StepAggregate.fold). Only an aggregate of the
shape the leader accepts is packed (`packable`): a malformed one goes up alone, so the leader
refuses it to its node as before.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np

from ftsup.common.step_pack import NO_REPLICA_GROUP
from ftsup.v1 import agent_pb2, shard_pb2

_U4, _U8, _F8 = np.dtype("<u4"), np.dtype("<u8"), np.dtype("<f8")
_MAX_TOKENS = 2**63 - 1  # (the leader reads tokens as int64)


def packable(message: agent_pb2.StepAggregate) -> bool:
    """Whether `message` has the shape the leader's decoding accepts (step_aggregate.to_input):
    ranks, per-rank arrays of their length (optional ones empty or full), every position in
    exactly one parameter-digest group, local-gradient positions in range and in one group at most."""
    count = len(message.ranks)
    if count == 0 or not len(message.step_time_s) == len(message.compute_time_s) == len(message.loss) == count:
        return False
    if len(message.grad_norm) not in (0, count) or len(message.replica_groups) not in (0, count):
        return False
    tokens = message.tokens
    if len(tokens) not in (0, count) or tokens and max(tokens) > _MAX_TOKENS:
        return False
    params = message.param_digests
    order = _order(count)
    if not (len(params) == 1 and params[0].indexes == order):  # (else: the usual aggregate, one digest)
        indexes = [index for group in params for index in group.indexes]
        if len(indexes) != count or sorted(indexes) != order:
            return False
    if message.local_grad_digests:
        grads = [index for group in message.local_grad_digests for index in group.indexes]
        return len(set(grads)) == len(grads) and max(grads, default=0) < count
    return True


def pack(parts: Sequence[tuple[int, agent_pb2.StepAggregate]]) -> shard_pb2.ShardStepFold:
    """(session, aggregate) pairs of one generation and step, each session once, each aggregate
    `packable`, as one fold in their order."""
    if not parts:
        raise ValueError("a step fold needs at least one aggregate")
    aggregates = [a for _, a in parts]
    first = aggregates[0]
    key = (first.generation, first.step)
    if any((a.generation, a.step) != key for a in aggregates) or len({s for s, _ in parts}) != len(parts):
        raise ValueError("a step fold holds one generation's step, each session once")
    counts = [len(a.ranks) for a in aggregates]
    total = sum(counts)
    params: dict[str, list[int]] = {}
    grads: dict[str, list[int]] = {}
    offset = 0
    for a, count in zip(aggregates, counts):
        for target, digest_groups in ((params, a.param_digests), (grads, a.local_grad_digests)):
            for group in digest_groups:
                positions = target.setdefault(group.digest, [])
                if offset:
                    positions.extend([index + offset for index in group.indexes])
                else:
                    positions.extend(group.indexes)
        offset += count
    message = shard_pb2.ShardStepFold(
        generation=first.generation, step=first.step, sessions=[s for s, _ in parts],
        counts=np.array(counts, dtype=_U4).tobytes(),
        ranks=_joined([a.ranks for a in aggregates], _U4, total),
        step_time_s=_joined([a.step_time_s for a in aggregates], _F8, total),
        compute_time_s=_joined([a.compute_time_s for a in aggregates], _F8, total),
        loss=_joined([a.loss for a in aggregates], _F8, total),
        param_digests=[shard_pb2.PackedDigests(digest=d, positions=np.array(p, dtype=_U4).tobytes())
                       for d, p in params.items()],
        local_grad_digests=[shard_pb2.PackedDigests(digest=d, positions=np.array(p, dtype=_U4).tobytes())
                            for d, p in grads.items()])
    if any(a.grad_norm for a in aggregates):
        message.grad_norm = _joined([a.grad_norm or [math.nan] * c for a, c in zip(aggregates, counts)], _F8, total)
    if any(a.tokens for a in aggregates):
        message.tokens = _joined([a.tokens or [0] * c for a, c in zip(aggregates, counts)], _U8, total)
    if any(a.replica_groups for a in aggregates):
        message.replica_groups = _joined([a.replica_groups or [NO_REPLICA_GROUP] * c
                                          for a, c in zip(aggregates, counts)], _U4, total)
    return message


def _joined(arrays: Sequence[Iterable[float]] | Sequence[Iterable[int]], dtype: np.dtype[np.generic], total: int
            ) -> bytes:
    """The parts' arrays end to end, as `dtype`'s bytes (one pass in C over the protobuf containers)."""
    return np.fromiter(itertools.chain.from_iterable(arrays), dtype=dtype, count=total).tobytes()


@functools.lru_cache(maxsize=64)  # (bounded: counts are the senders' to choose)
def _order(count: int) -> list[int]:
    return list(range(count))
