"""AgentPeer service: other agents stream buddy copies here and fetch snapshots for restores.

Both are chunk streams (agent/streams.py). Every call is first authorized (agent/peer_auth.py:
the current directive says which node may store or fetch which rank here); a refusal names why.
A stored copy is held and reported (with its SHA-256) only once it arrived whole and verified; a
truncated, oversized or mismatched stream is discarded and answered INVALID_ARGUMENT, one over the
memory limit RESOURCE_EXHAUSTED, each with a log line, never a crash.

Bounds, so a peer cannot pin this node's memory or slots: at most `max_streams` calls at once
(more are answered RESOURCE_EXHAUSTED at once); a store's header must come within
`header_timeout_s`, every later chunk within `idle_timeout_s` of the one before, and the whole
stream within its size's deadline (common/chunks.py `stream_deadline_s`); a fetch that stops
reading is cut off at the same deadline, and the blob it streams stays counted against the memory
limit until it ends (SnapshotStore.reading). The reservation of a store is released on every way
out (try/finally): a refusal, a failed read, a deadline, or the caller's cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import structlog

from ftsup.agent.codec import holding_report
from ftsup.agent.link import Reports
from ftsup.agent.log_tail import LogNotFound, LogTailer, TooManyTails
from ftsup.agent.peer_auth import Denial, PeerAuthority
from ftsup.agent.peers import ACCEPTED
from ftsup.agent.snapshots import Incoming, InvalidSnapshot, SnapshotMemoryFull, SnapshotStore
from ftsup.agent.streams import Read, ident_of, opening_chunk, receive, send_blob
from ftsup.common.chunks import CHUNK_BYTES, stream_deadline_s
from ftsup.common.tls import PeerKind, peer_identity
from ftsup.v1 import peer_pb2, peer_pb2_grpc

Logger = structlog.typing.FilteringBoundLogger
Context = grpc.aio.ServicerContext
MAX_PEER_STREAMS = 16  # concurrent AgentPeer calls; a node has a handful of buddies and restorers
HEADER_TIMEOUT_S = 10.0  # a store's first chunk: the sender writes it before anything else
IDLE_TIMEOUT_S = 30.0  # the longest gap between two chunks of a store


class PeerService(peer_pb2_grpc.AgentPeerServicer):
    def __init__(self, node_id: str, store: SnapshotStore, reports: Reports, log: Logger, authority: PeerAuthority,
                 *, is_tls: bool = False, chunk_bytes: int = CHUNK_BYTES, max_streams: int = MAX_PEER_STREAMS,
                 header_timeout_s: float = HEADER_TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 deadline_s: Callable[[int], float] = stream_deadline_s, logs: LogTailer | None = None) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self._node_id = node_id
        self._is_tls = is_tls  # mTLS: the caller's node id comes from its certificate
        self._store = store
        self._reports = reports
        self._log = log
        self._authority = authority
        self._chunk_bytes = chunk_bytes
        self._max_streams = max_streams
        self._header_timeout_s = header_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._deadline_s = deadline_s  # a whole stream of that many bytes, either way
        self.streams = 0  # calls in progress
        self._logs = logs  # ranks' output for supervisorctl logs (None: not served)

    async def StoreSnapshot(self, request_iterator: Any, context: Context) -> peer_pb2.StoreSnapshotResponse:
        caller = await self._caller(context, claimed="")
        await self._enter(context)
        try:
            return await self._store_snapshot(caller, context)
        finally:
            self.streams -= 1

    async def _store_snapshot(self, caller: str | None, context: Context) -> peer_pb2.StoreSnapshotResponse:
        header = None
        incoming: Incoming | None = None
        try:
            async with asyncio.timeout(self._header_timeout_s):
                first, header = opening_chunk(await context.read())
            if denial := self._authority.store_denial(caller or header.owner_node_id, header):
                await self._deny(context, "store", denial, header)
            incoming = self._store.receive(ident_of(header), header.size_bytes)
            await context.send_initial_metadata(((ACCEPTED, "1"),))  # the sender's go-ahead (peers.py)
            async with asyncio.timeout(self._deadline_s(header.size_bytes)):
                blob = await receive(first, self._idle_bounded(context.read), incoming)
        except TimeoutError:
            stalled = "sent no header" if header is None else f"stalled after {incoming.received_bytes if incoming else 0} bytes"
            message = f"snapshot stream {stalled}: cut off"
            self._refuse(context, header, message)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, message)
        except InvalidSnapshot as exc:
            self._refuse(context, header, str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except SnapshotMemoryFull as exc:
            self._refuse(context, header, str(exc))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        finally:
            # Owned here from `receive` on: any way out before the snapshot was held (a cancelled
            # call: CancelledError is a BaseException; a failed send_initial_metadata) returns it.
            if incoming is not None and not incoming.is_ended:
                incoming.truncated()
        self._log.debug(
            "buddy_snapshot_stored", owner=blob.owner_node_id, generation=blob.generation, rank=blob.rank, step=blob.step,
            size_bytes=blob.size_bytes, bytes_held=self._store.bytes_held,
        )
        self._reports.send(holding_report(blob, self._node_id))
        return peer_pb2.StoreSnapshotResponse(holder_node_id=self._node_id)

    def _idle_bounded(self, read: Read) -> Read:
        async def bounded() -> object:
            async with asyncio.timeout(self._idle_timeout_s):
                return await read()
        return bounded

    def _refuse(self, context: Context, header: peer_pb2.SnapshotHeader | None, error: str) -> None:
        where = {} if header is None else {"owner": header.owner_node_id, "generation": header.generation,
                                           "rank": header.rank, "step": header.step}
        self._log.warning("peer_snapshot_rejected", peer=context.peer(), error=error, **where)

    # mypy-protobuf types a server-streaming servicer method as an iterator; grpc.aio also serves a
    # coroutine that writes with context.write (here, so that a deadline bounds the writes).
    async def FetchSnapshot(self, request: peer_pb2.FetchSnapshotRequest, context: Context) -> None:  # type: ignore[override]
        caller = await self._caller(context, claimed=request.node_id)
        if denial := self._authority.fetch_denial(caller or request.node_id, request):
            await self._deny(context, "fetch", denial, None)
        await self._enter(context)
        try:
            with self._store.reading(request.rank, request.step) as blob:
                if blob is None:
                    held = ", ".join(f"{r}@{s}" for r, s in self._store.keys()) or "none"
                    message = (
                        f"node {self._node_id} holds no snapshot of rank {request.rank} step {request.step} "
                        f"(holds rank@step: {held})"
                    )
                    self._log.info("peer_fetch_missing", rank=request.rank, step=request.step)
                    await context.abort(grpc.StatusCode.NOT_FOUND, message)
                try:
                    async with asyncio.timeout(self._deadline_s(blob.size_bytes)):
                        await send_blob(context.write, blob, self._chunk_bytes)
                    return
                except TimeoutError:
                    pass
            # The reader stalled: the blob is let go first (above), then the call ends with a status
            # set rather than an abort, which would queue behind the cancelled write.
            message = f"fetch of rank {request.rank} step {request.step}: the reader stalled; cut off"
            self._log.warning("peer_fetch_stalled", peer=context.peer(), rank=request.rank, step=request.step)
            context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
            context.set_details(message)
        finally:
            self.streams -= 1

    async def _enter(self, context: Context) -> None:
        """Takes one of the `max_streams` slots (the caller releases it), or refuses the call."""
        if self.streams >= self._max_streams:
            message = f"node {self._node_id} serves {self.streams} snapshot streams already (at most {self._max_streams})"
            self._log.warning("peer_streams_full", peer=context.peer(), streams=self.streams)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        self.streams += 1

    async def _deny(self, context: Context, what: str, denial: Denial, header: peer_pb2.SnapshotHeader | None) -> None:
        if denial.code is grpc.StatusCode.UNAVAILABLE:
            self._log.info("peer_request_early", peer=context.peer(), request=what, reason=denial.message)
        else:
            self._log.warning("peer_request_denied", peer=context.peer(), request=what, code=denial.code.name,
                              reason=denial.message)
        await context.abort(denial.code, denial.message)

    async def TailLog(self, request: peer_pb2.TailLogRequest, context: Context) -> AsyncIterator[peer_pb2.LogLines]:
        """A rank's output for a supervisor's relay. With mTLS only a supervisor certificate may read
        it (output can hold paths, hyper-parameters, data samples); its own stream cap bounds it."""
        if self._is_tls:
            identity = peer_identity(context)
            if identity is None or identity.kind is not PeerKind.SUPERVISOR:
                self._log.warning("log_tail_refused", peer=context.peer(), identity=str(identity) if identity else None)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"ranks' output is served to supervisors only; caller is {identity or 'unknown'}")
        if self._logs is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"node {self._node_id} does not serve ranks' output")
        assert self._logs is not None
        try:
            async for message in self._logs.tail(request):
                yield message
        except LogNotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except TooManyTails as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))

    async def _caller(self, context: Context, claimed: str) -> str | None:
        """The caller's node id from its certificate with mTLS (None without TLS: ids are claims)."""
        if not self._is_tls:
            return None
        identity = peer_identity(context)
        if identity is None or identity.kind is not PeerKind.NODE:
            self._log.warning("peer_refused", peer=context.peer(), identity=str(identity) if identity else None)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"snapshots are served to agents only (node certificates); caller is {identity or 'unknown'}")
        assert identity is not None
        if claimed and claimed != identity.name:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"caller claims node {claimed!r} but its certificate is {identity}")
        return identity.name
