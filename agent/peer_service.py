"""AgentPeer service: other agents store buddy copies here and fetch snapshots for restores.

Bad input (bad sha, empty payload) gets INVALID_ARGUMENT and a log line, never a crash.
"""

from __future__ import annotations

import grpc
import structlog
from ftsup.v1 import peer_pb2, peer_pb2_grpc

from agent.codec import blob_from_proto, blob_to_proto, holding_report
from agent.link import Reports
from agent.snapshots import InvalidBlob, SnapshotStore
from supervisor.tls import PeerKind, peer_identity

Logger = structlog.typing.FilteringBoundLogger
Context = grpc.aio.ServicerContext


class PeerService(peer_pb2_grpc.AgentPeerServicer):
    def __init__(self, node_id: str, store: SnapshotStore, reports: Reports, log: Logger, *, is_tls: bool = False) -> None:
        self._node_id = node_id
        self._is_tls = is_tls  # mTLS: only agents (node certificates) may store or fetch snapshots
        self._store = store
        self._reports = reports
        self._log = log

    async def StoreSnapshot(self, request: peer_pb2.StoreSnapshotRequest, context: Context) -> peer_pb2.StoreSnapshotResponse:  # noqa: N802
        await self._check_caller(context)
        blob = blob_from_proto(request.blob)
        try:
            await self._store.put_off_loop(blob)
        except InvalidBlob as exc:
            self._log.warning("peer_snapshot_rejected", peer=context.peer(), owner=blob.owner_node_id,
                              generation=blob.generation, rank=blob.rank, step=blob.step, error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._log.debug(
            "buddy_snapshot_stored", owner=blob.owner_node_id, generation=blob.generation, rank=blob.rank, step=blob.step,
            size_bytes=len(blob.payload), bytes_held=self._store.bytes_held,
        )
        self._reports.send(holding_report(blob, self._node_id))
        return peer_pb2.StoreSnapshotResponse(holder_node_id=self._node_id)

    async def FetchSnapshot(self, request: peer_pb2.FetchSnapshotRequest, context: Context) -> peer_pb2.FetchSnapshotResponse:  # noqa: N802
        await self._check_caller(context)
        blob = self._store.get(request.rank, request.step)
        if blob is None:
            held = ", ".join(f"{r}@{s}" for r, s in self._store.keys()) or "none"
            message = (
                f"node {self._node_id} holds no snapshot of rank {request.rank} step {request.step} "
                f"(holds rank@step: {held})"
            )
            self._log.info("peer_fetch_missing", rank=request.rank, step=request.step)
            await context.abort(grpc.StatusCode.NOT_FOUND, message)
        return peer_pb2.FetchSnapshotResponse(blob=blob_to_proto(blob))

    async def _check_caller(self, context: Context) -> None:
        if not self._is_tls:
            return
        identity = peer_identity(context)
        if identity is None or identity.kind is not PeerKind.NODE:
            self._log.warning("peer_refused", peer=context.peer(), identity=str(identity) if identity else None)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"snapshots are served to agents only (node certificates); caller is {identity or 'unknown'}")
