"""Proto <-> agent dataclasses for snapshot blobs; the one place the two meet."""

from __future__ import annotations

from ftsup.v1 import agent_pb2, peer_pb2

from agent.snapshots import Blob


def blob_from_proto(msg: peer_pb2.SnapshotBlob) -> Blob:
    return Blob(
        generation=msg.generation,
        rank=msg.rank,
        step=msg.step,
        owner_node_id=msg.owner_node_id,
        payload=bytes(msg.payload),
        sha256=msg.sha256,
    )


def blob_to_proto(blob: Blob) -> peer_pb2.SnapshotBlob:
    return peer_pb2.SnapshotBlob(
        generation=blob.generation,
        rank=blob.rank,
        step=blob.step,
        owner_node_id=blob.owner_node_id,
        payload=blob.payload,
        sha256=blob.sha256,
    )


def holding_report(blob: Blob, holder_node_id: str) -> agent_pb2.AgentMessage:
    """Tells the supervisor this node now holds `blob`: every holder reports only itself, so a
    step commits even when the owner's agent dies right after its buddy took the copy."""
    return agent_pb2.AgentMessage(
        snapshot_report=agent_pb2.SnapshotReport(
            generation=blob.generation, rank=blob.rank, step=blob.step,
            holder_node_ids=[holder_node_id], size_bytes=len(blob.payload),
        )
    )
