"""Proto <-> agent dataclasses for snapshot reports; the one place the two meet for the supervisor
link (chunk streams: agent/streams.py)."""

from __future__ import annotations

from ftsup.agent.core.snapshot_budget import SnapshotBudget
from ftsup.agent.snapshots import Blob
from ftsup.v1 import agent_pb2


def holding_report(blob: Blob, holder_node_id: str) -> agent_pb2.AgentMessage:
    """Tells the supervisor this node now holds `blob`: every holder reports only itself, so a
    step commits even when the owner's agent dies right after its buddy took the copy. The digest
    lets the supervisor commit only when the owner's and the buddy's bytes agree."""
    return agent_pb2.AgentMessage(
        snapshot_report=agent_pb2.SnapshotReport(
            generation=blob.generation, rank=blob.rank, step=blob.step,
            holder_node_ids=[holder_node_id], size_bytes=blob.size_bytes, sha256=blob.sha256,
        )
    )


def snapshot_memory_report(budget: SnapshotBudget) -> agent_pb2.AgentMessage:
    """The snapshot store's limit and its basis, for the operator's view of the node."""
    return agent_pb2.AgentMessage(snapshot_memory=agent_pb2.SnapshotMemory(
        limit_bytes=budget.limit_bytes, derived_bytes=budget.derived_bytes, basis=budget.basis.value,
        ranks=budget.ranks, reason=budget.reason))
