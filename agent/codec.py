"""Proto <-> agent dataclasses for snapshot blobs; the one place the two meet."""

from __future__ import annotations

from ftsup.v1 import peer_pb2

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
