"""SnapshotHoldings on the wire -> the core's SnapshotHoldings (the same columns, as tuples).

Decoding checks the shape (one size and one digest per rank, each rank once) and says what is
wrong; whether the sender may hold each rank is admission's question (core/admission.py), asked
of every entry as it is of a SnapshotReport. The holder is the stream's node, never the message.
"""

from __future__ import annotations

from ftsup.supervisor.core.inputs import SnapshotHoldings, SnapshotReport
from ftsup.supervisor.core.limits import MAX_RANKS_PER_NODE_REPORT
from ftsup.v1 import agent_pb2


class MalformedHoldings(ValueError):
    """A SnapshotHoldings message whose parts do not fit together; the text says which."""


def to_input(node_id: str, message: agent_pb2.SnapshotHoldings) -> SnapshotHoldings:
    """The core input: every entry held by the sender (the stream's node)."""
    count = len(message.ranks)
    if count == 0:
        raise MalformedHoldings("snapshot holdings with no ranks")
    if count > MAX_RANKS_PER_NODE_REPORT:  # checked before building anything of that size
        raise MalformedHoldings(f"snapshot holdings of {count} ranks (at most {MAX_RANKS_PER_NODE_REPORT})")
    for name in ("size_bytes", "sha256"):
        if len(getattr(message, name)) != count:
            raise MalformedHoldings(f"{name} has {len(getattr(message, name))} values for {count} ranks")
    return SnapshotHoldings(node_id, message.generation, message.step, tuple(message.ranks),
                            tuple(message.size_bytes), tuple(message.sha256))


def report_from_proto(node_id: str, s: agent_pb2.SnapshotReport) -> SnapshotReport:
    """One SnapshotReport as the core input (the reporter is the stream's node)."""
    return SnapshotReport(node_id, s.generation, s.rank, s.step, tuple(s.holder_node_ids), s.size_bytes, s.sha256)
