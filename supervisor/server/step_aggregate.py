"""StepAggregate on the wire <-> the core's StepAggregate of StepReports.

The wire form packs per-rank values into arrays and sends each digest once with the positions of
the ranks that reported it (at 12,500 nodes the replicas of a data-parallel job agree: a handful
of distinct digests per step instead of one string per rank). Decoding checks the shape (array
lengths, every rank in exactly one parameter-digest group) and says what is wrong; the values
themselves are checked by admission like any StepReport's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ftsup.common import step_pack
from ftsup.common.step_pack import NO_REPLICA_GROUP
from ftsup.supervisor.core.inputs import StepAggregate, StepReport
from ftsup.v1 import agent_pb2


class MalformedAggregate(ValueError):
    """A StepAggregate message whose parts do not fit together; the text says which."""


def to_input(node_id: str, message: agent_pb2.StepAggregate) -> StepAggregate:
    """The core input; every report is the sender's own (its node id comes from the stream)."""
    count = len(message.ranks)
    if count == 0:
        raise MalformedAggregate("a step aggregate with no ranks")
    for name in ("step_time_s", "compute_time_s", "loss"):
        if len(getattr(message, name)) != count:
            raise MalformedAggregate(f"{name} has {len(getattr(message, name))} values for {count} ranks")
    for name in ("grad_norm", "tokens", "replica_groups"):
        if len(getattr(message, name)) not in (0, count):
            raise MalformedAggregate(f"{name} has {len(getattr(message, name))} values for {count} ranks (or none)")
    params = _spread(message.param_digests, count, "param_digests")
    if any(digest is None for digest in params):
        missing = next(message.ranks[i] for i, d in enumerate(params) if d is None)
        raise MalformedAggregate(f"rank {missing} is in no param_digests group")
    grads = _spread(message.local_grad_digests, count, "local_grad_digests")
    reports = tuple(
        StepReport(
            node_id, message.generation, message.ranks[i], message.step, message.step_time_s[i],
            message.compute_time_s[i], message.loss[i], params[i] or "",
            message.grad_norm[i] if message.grad_norm else math.nan,
            message.tokens[i] if message.tokens else 0,
            grads[i] or "",
            _replica_group(message, i),
        )
        for i in range(count)
    )
    return StepAggregate(message.generation, message.step, reports)


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


def _spread(groups: Sequence[agent_pb2.DigestGroup], count: int, name: str) -> list[str | None]:
    spread: list[str | None] = [None] * count
    for group in groups:
        for index in group.indexes:
            if index >= count:
                raise MalformedAggregate(f"{name}: index {index} is past the {count} ranks")
            if spread[index] is not None:
                raise MalformedAggregate(f"{name}: position {index} is in two groups")
            spread[index] = group.digest
    return spread


def _replica_group(message: agent_pb2.StepAggregate, index: int) -> int | None:
    if not message.replica_groups:
        return None
    value = message.replica_groups[index]
    return None if value == NO_REPLICA_GROUP else value
