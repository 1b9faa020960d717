"""StepReports of one generation and step packed into one StepAggregate (issue 14).

Shared by the agent (its node's ranks: one message per node per step instead of one per rank)
and a link shard (its nodes' queued reports). Per-rank values become packed arrays in the order
of the reports; each distinct digest is sent once with the positions of the ranks that reported
it (replicas agree: a handful of digests per step instead of one string per rank). Optional
fields are sent only when some rank reported them. The leader unpacks and checks it in
supervisor/server/step_aggregate.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ftsup.v1 import agent_pb2

NO_REPLICA_GROUP = 0xFFFFFFFF  # in `replica_groups`: this rank did not report one


def pack(reports: Sequence[agent_pb2.StepReport]) -> agent_pb2.StepAggregate:
    """One step's reports (one generation and step, each rank once) as one aggregate."""
    if not reports:
        raise ValueError("a step aggregate needs at least one report")
    first = reports[0]
    key = (first.generation, first.step)
    if any((r.generation, r.step) != key for r in reports) or len({r.rank for r in reports}) != len(reports):
        raise ValueError("a step aggregate holds one generation's step, each rank once")
    message = agent_pb2.StepAggregate(generation=first.generation, step=first.step)
    message.ranks.extend(r.rank for r in reports)
    message.step_time_s.extend(r.step_time_s for r in reports)
    message.compute_time_s.extend(r.compute_time_s for r in reports)
    message.loss.extend(r.loss for r in reports)
    if any(r.HasField("grad_norm") for r in reports):
        message.grad_norm.extend(r.grad_norm if r.HasField("grad_norm") else float("nan") for r in reports)
    if any(r.tokens for r in reports):
        message.tokens.extend(r.tokens for r in reports)
    if any(r.HasField("replica_group") for r in reports):
        message.replica_groups.extend(r.replica_group if r.HasField("replica_group") else NO_REPLICA_GROUP
                                      for r in reports)
    _group(message.param_digests, [r.param_digest for r in reports])
    _group(message.local_grad_digests, [r.local_grad_digest for r in reports], skip_empty=True)
    return message


def _group(target: Any, digests: list[str], *, skip_empty: bool = False) -> None:
    by_value: dict[str, list[int]] = {}
    for index, digest in enumerate(digests):
        if digest or not skip_empty:
            by_value.setdefault(digest, []).append(index)
    for digest, indexes in by_value.items():
        target.add(digest=digest, indexes=indexes)
