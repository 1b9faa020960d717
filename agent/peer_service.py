"""AgentPeer service: other agents stream buddy copies here and fetch snapshots for restores.

Both are chunk streams (agent/streams.py). A stored copy is held and reported only once it
arrived whole and verified; a truncated, oversized or mismatched stream is discarded and answered
INVALID_ARGUMENT, one over the memory limit RESOURCE_EXHAUSTED, each with a log line, never a crash.
"""

from __future__ import annotations

from typing import Any

import grpc
import structlog
from ftsup.v1 import peer_pb2, peer_pb2_grpc

from ftsup.agent.codec import holding_report
from ftsup.common.chunks import CHUNK_BYTES
from ftsup.agent.link import Reports
from ftsup.agent.peers import ACCEPTED
from ftsup.agent.snapshots import InvalidSnapshot, SnapshotMemoryFull, SnapshotStore
from ftsup.agent.streams import ident_of, opening_header, receive, send_blob
from ftsup.common.tls import PeerKind, peer_identity

Logger = structlog.typing.FilteringBoundLogger
Context = grpc.aio.ServicerContext


class PeerService(peer_pb2_grpc.AgentPeerServicer):
    def __init__(self, node_id: str, store: SnapshotStore, reports: Reports, log: Logger, *, is_tls: bool = False,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        self._node_id = node_id
        self._is_tls = is_tls  # mTLS: only agents (node certificates) may store or fetch snapshots
        self._store = store
        self._reports = reports
        self._log = log
        self._chunk_bytes = chunk_bytes

    async def StoreSnapshot(self, request_iterator: Any, context: Context) -> peer_pb2.StoreSnapshotResponse:  # noqa: N802
        await self._check_caller(context)
        header = None
        try:
            first = await context.read()
            header = opening_header(first)
            incoming = self._store.receive(ident_of(header), header.size_bytes)
            await context.send_initial_metadata(((ACCEPTED, "1"),))  # the sender's go-ahead (peers.py)
            blob = await receive(first, context.read, incoming)
        except InvalidSnapshot as exc:
            self._refuse(context, header, str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except SnapshotMemoryFull as exc:
            self._refuse(context, header, str(exc))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        self._log.debug(
            "buddy_snapshot_stored", owner=blob.owner_node_id, generation=blob.generation, rank=blob.rank, step=blob.step,
            size_bytes=blob.size_bytes, bytes_held=self._store.bytes_held,
        )
        self._reports.send(holding_report(blob, self._node_id))
        return peer_pb2.StoreSnapshotResponse(holder_node_id=self._node_id)

    def _refuse(self, context: Context, header: peer_pb2.SnapshotHeader | None, error: str) -> None:
        where = {} if header is None else {"owner": header.owner_node_id, "generation": header.generation,
                                           "rank": header.rank, "step": header.step}
        self._log.warning("peer_snapshot_rejected", peer=context.peer(), error=error, **where)

    async def FetchSnapshot(self, request: peer_pb2.FetchSnapshotRequest, context: Context) -> None:  # noqa: N802
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
        await send_blob(context.write, blob, self._chunk_bytes)

    async def _check_caller(self, context: Context) -> None:
        if not self._is_tls:
            return
        identity = peer_identity(context)
        if identity is None or identity.kind is not PeerKind.NODE:
            self._log.warning("peer_refused", peer=context.peer(), identity=str(identity) if identity else None)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"snapshots are served to agents only (node certificates); caller is {identity or 'unknown'}")
