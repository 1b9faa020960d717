"""SnapshotReports of one generation and step packed into one SnapshotHoldings (issue 14).

Shared by the agent (its node's holdings of a step: one message instead of one per rank and
holder) and a link shard (a session's queued reports). Every report must be the sender's own
holding (its `holder_node_ids` name only the sender, or nobody): the packed form has no holder
field, the stream's node is the holder, as the leader counts a SnapshotReport today. The leader
unpacks and checks it in supervisor/server/snapshot_holdings.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from ftsup.v1 import agent_pb2


def key(report: agent_pb2.SnapshotReport) -> tuple[int, int]:
    """What reports must share to go in one SnapshotHoldings: (generation, step)."""
    return report.generation, report.step


def pack(reports: Sequence[agent_pb2.SnapshotReport]) -> agent_pb2.SnapshotHoldings:
    """One step's holdings (one generation and step, each rank once) as one message."""
    if not reports:
        raise ValueError("snapshot holdings need at least one report")
    first = key(reports[0])
    if any(key(r) != first for r in reports) or len({r.rank for r in reports}) != len(reports):
        raise ValueError("snapshot holdings hold one generation's step, each rank once")
    message = agent_pb2.SnapshotHoldings(generation=first[0], step=first[1])
    message.ranks.extend(r.rank for r in reports)
    message.size_bytes.extend(r.size_bytes for r in reports)
    message.sha256.extend(r.sha256 for r in reports)
    return message
