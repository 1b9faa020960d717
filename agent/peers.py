"""Client side of AgentPeer: stream a snapshot to a buddy, fetch one from a source node.

Owns the channels to other agents (one per address and expected node, reused) and the retry
policy for them. Under mTLS every channel pins the node it expects (common/tls.expect_node): the
handshake accepts only that node's certificate, so a peer at a reused or hijacked address that
presents another node's identity is refused before a byte of a snapshot moves. Both
directions are chunk streams (agent/streams.py): a store may start while the snapshot is still
arriving from the trainer (pipelined), and a retry restarts it from its first byte.
Errors leave as `PeerUnavailable` (retryable, raised after the deadline, or refused by the peer),
`SnapshotMissing` or `InvalidSnapshot` (the bytes were wrong; nothing was kept).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from ftsup.agent.grpc_options import MESSAGE_OPTIONS
from ftsup.agent.snapshots import Blob, Incoming, SnapshotId, SnapshotStore, physical_memory_bytes
from ftsup.agent.streams import header_of, ident_of, opening_chunk, receive, send
from ftsup.common import chunk_wire, tls
from ftsup.common.backoff import Backoff
from ftsup.common.chunk_wire import Chunk
from ftsup.common.chunks import CHUNK_BYTES, Assembly, InvalidSnapshot, stream_deadline_s
from ftsup.common.deadline import within
from ftsup.v1 import peer_pb2

FETCH_BACKOFF = Backoff(initial_s=0.1, max_s=2.0, deadline_s=30.0)
T = TypeVar("T")
STORE_BACKOFF = Backoff(initial_s=0.1, max_s=1.0, deadline_s=5.0)
HEADER_TIMEOUT_S = 60.0  # a fetch's first chunk (the header: the size, hence the rest's deadline)
# Answers that retrying cannot change: the peer refused the request or the snapshot.
_REFUSED = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                      grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION})

Pieces = Callable[[], AsyncIterator[tuple[memoryview, str]]]  # a fresh pass over the payload per attempt


class PeerUnavailable(RuntimeError):
    """The peer could not be reached (or refused) until the retry deadline."""


class PeerDenied(PeerUnavailable):
    """The peer refused this node (PERMISSION_DENIED): no grant for it in the peer's directive.
    Grants travel in directives, which reach each node on its own stream: a caller that learned of
    its task first may ask again shortly (agent/sdc_check.py does)."""


class PeerIdentityUnknown(PeerUnavailable):
    """Under mTLS a peer call must name the node it expects at the address; this one did not."""


ACCEPTED = "ftsup-snapshot-accepted"  # initial metadata key: the peer took the header on


class SnapshotMissing(LookupError):
    """The peer answered that it does not hold the requested snapshot; not retried."""


_PEER = "/" + peer_pb2.DESCRIPTOR.services_by_name["AgentPeer"].full_name


class _SnapshotCalls:
    """AgentPeer's snapshot methods on one channel, through the chunk codec (common/chunk_wire.py)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.StoreSnapshot = chunk_wire.stream_unary(channel, f"{_PEER}/StoreSnapshot", peer_pb2.StoreSnapshotResponse)
        self.FetchSnapshot = chunk_wire.unary_stream(channel, f"{_PEER}/FetchSnapshot", peer_pb2.FetchSnapshotRequest)


class PeerClient:
    def __init__(self, rng: random.Random | None = None, credentials: grpc.ChannelCredentials | None = None,
                 *, chunk_bytes: int = CHUNK_BYTES, options: list[tuple[str, int]] | None = None,
                 node_id: str = "") -> None:
        self._node_id = node_id  # named in fetch requests (without mTLS the source takes it as a claim)
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}  # (address, expected node id)
        self._rng = rng or random.Random()
        self._credentials = credentials  # mTLS to peers (their AgentPeer requires it); None: plaintext
        self._chunk_bytes = chunk_bytes
        self._options = options if options is not None else MESSAGE_OPTIONS

    def _stub(self, address: str, node_id: str) -> _SnapshotCalls:
        channel = self._channels.get((address, node_id))
        if channel is None:
            if self._credentials is not None:
                if not node_id:
                    raise PeerIdentityUnknown(f"a peer call to {address} under mTLS must name the node expected there")
                options = [*self._options, *tls.expect_node(node_id)]
                channel = grpc.aio.secure_channel(address, self._credentials, options=options)
            else:  # plaintext (loopback tests, --insecure): nothing to pin
                channel = grpc.aio.insecure_channel(address, options=self._options)
            self._channels[(address, node_id)] = channel
        return _SnapshotCalls(channel)

    async def store(self, address: str, ident: SnapshotId, size_bytes: int, pieces: Pieces,
                    backoff: Backoff = STORE_BACKOFF, *, node_id: str = "") -> str:
        """Streams a snapshot to the peer at `address`; returns the holder node id it reports.

        `pieces()` yields the payload's slices and, with the last, its SHA-256 (`Incoming.follow`
        for a snapshot still arriving); it raising InvalidSnapshot cancels the stream, and the peer
        keeps nothing. `node_id` is the node expected at `address` (the directive's buddy): under
        mTLS the handshake accepts only its certificate.
        """
        header = header_of(ident, size_bytes)

        async def attempt(stub: _SnapshotCalls) -> peer_pb2.StoreSnapshotResponse:
            call = stub.StoreSnapshot(None, timeout=stream_deadline_s(size_bytes))  # None: written below
            try:
                try:
                    # Handshake: the header alone, then the peer's initial metadata says it took
                    # the snapshot on (ACCEPTED). A refusal (too big, no room) ends the call before
                    # any data is written, so its status arrives intact: a refusal written into
                    # mid-stream can surface as a bare INTERNAL, which would be retried.
                    await call.write(Chunk(header))
                    if (ACCEPTED, "1") not in tuple(await call.initial_metadata() or ()):
                        return await call  # raises the refusal's own status
                    await send(call.write, header, pieces(), header_sent=True)
                    await call.done_writing()
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    # The peer ended the call while chunks were still going out (it refused the
                    # header, say): the failed write reports INTERNAL, the call's own status why.
                    pass
                return await call
            except BaseException:
                call.cancel()  # the peer discards the partial stream
                raise

        response = await self._retry(address, node_id, backoff, attempt)
        return response.holder_node_id

    async def fetch(self, address: str, rank: int, step: int, store: SnapshotStore | None = None,
                    backoff: Backoff = FETCH_BACKOFF, *, generation: int = 0, node_id: str = "") -> Blob:
        """Fetches the (rank, step) snapshot from the peer at `address`, verified as it streams in.

        With `store`, it is received into the store (reserved against its memory limit, held once
        verified); without, into a buffer of its own. `generation` is the one the fetch is for: a
        source that has not applied it yet answers UNAVAILABLE, and the fetch is retried.
        `node_id` is the source node expected at `address` (pinned under mTLS, as for `store`).
        """
        request = peer_pb2.FetchSnapshotRequest(rank=rank, step=step, generation=generation, node_id=self._node_id)

        async def attempt(stub: _SnapshotCalls) -> Blob:
            call = stub.FetchSnapshot(request)
            try:
                first, header = opening_chunk(await within(call.read(), HEADER_TIMEOUT_S))
                if (header.rank, header.step) != (rank, step):
                    raise PeerUnavailable(f"{address} answered rank {header.rank} step {header.step} "
                                          f"for rank {rank} step {step}")
                incoming = self._incoming(ident_of(header), header.size_bytes, store)
                async with asyncio.timeout(stream_deadline_s(header.size_bytes)):
                    return await receive(first, call.read, incoming)
            except TimeoutError as exc:
                raise PeerUnavailable(f"{address}: fetch of rank {rank} step {step} stalled: {exc!r}") from exc
            finally:
                call.cancel()  # no-op once the stream ended

        return await self._retry(address, node_id, backoff, attempt)

    @staticmethod
    def _incoming(ident: SnapshotId, size_bytes: int, store: SnapshotStore | None) -> Incoming:
        if store is not None:
            return store.receive(ident, size_bytes)
        if size_bytes == 0:
            raise InvalidSnapshot(f"{ident.describe()}: empty payload")
        return Incoming(ident, Assembly(ident.describe(), size_bytes, physical_memory_bytes(), hash_later=True))

    async def _retry(
        self, address: str, node_id: str, backoff: Backoff,
        call: Callable[[_SnapshotCalls], Awaitable[T]],
    ) -> T:
        """Retries UNAVAILABLE-like failures with jittered backoff until the policy's deadline."""
        waited_s = 0.0
        attempt = 0
        while True:
            try:
                return await call(self._stub(address, node_id))
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    raise SnapshotMissing(f"{address}: {exc.details()}") from exc
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise PeerDenied(f"{address} refused: {exc.code().name} {exc.details()}") from exc
                if exc.code() in _REFUSED:
                    raise PeerUnavailable(f"{address} refused: {exc.code().name} {exc.details()}") from exc
                delay_s = backoff.delay_s(attempt, self._rng)
                if backoff.is_exhausted(waited_s + delay_s):
                    raise PeerUnavailable(
                        f"{address} unreachable after {attempt + 1} attempts over {waited_s:.1f}s: "
                        f"{exc.code().name} {exc.details()}"
                    ) from exc
                await asyncio.sleep(delay_s)
                waited_s += delay_s
                attempt += 1

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)  # grace None (grpc's default): calls still open are cancelled
        self._channels.clear()
