"""Client side of AgentPeer: store a snapshot on a buddy, fetch one from a source node.

Owns the channels to other agents (one per address, reused) and the retry policy for them.
Errors leave as `PeerUnavailable` (retryable, raised after the deadline) or `InvalidBlob`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from ftsup.v1 import peer_pb2, peer_pb2_grpc
from supervisor.core.backoff import Backoff

from agent.codec import blob_from_proto, blob_to_proto
from agent.grpc_options import MESSAGE_OPTIONS
from agent.snapshots import Blob, verify

FETCH_BACKOFF = Backoff(initial_s=0.1, max_s=2.0, deadline_s=30.0)
T = TypeVar("T")
STORE_BACKOFF = Backoff(initial_s=0.1, max_s=1.0, deadline_s=5.0)
RPC_TIMEOUT_S = 60.0


class PeerUnavailable(RuntimeError):
    """The peer could not be reached (or refused) until the retry deadline."""


class SnapshotMissing(LookupError):
    """The peer answered that it does not hold the requested snapshot; not retried."""


class PeerClient:
    def __init__(self, rng: random.Random | None = None, credentials: grpc.ChannelCredentials | None = None) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._rng = rng or random.Random()
        self._credentials = credentials  # mTLS to peers (their AgentPeer requires it); None: plaintext

    def _stub(self, address: str) -> peer_pb2_grpc.AgentPeerStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = (grpc.aio.secure_channel(address, self._credentials, options=MESSAGE_OPTIONS)
                       if self._credentials is not None else grpc.aio.insecure_channel(address, options=MESSAGE_OPTIONS))
            self._channels[address] = channel
        return peer_pb2_grpc.AgentPeerStub(channel)

    async def store(self, address: str, blob: Blob, backoff: Backoff = STORE_BACKOFF) -> str:
        """Stores `blob` on the peer at `address`; returns the holder node id it reports."""
        request = peer_pb2.StoreSnapshotRequest(blob=blob_to_proto(blob))
        response = await self._retry(address, backoff, lambda stub: stub.StoreSnapshot(request, timeout=RPC_TIMEOUT_S))
        return response.holder_node_id

    async def fetch(self, address: str, rank: int, step: int, backoff: Backoff = FETCH_BACKOFF) -> Blob:
        """Fetches and verifies the (rank, step) snapshot from the peer at `address`."""
        request = peer_pb2.FetchSnapshotRequest(rank=rank, step=step)
        response = await self._retry(address, backoff, lambda stub: stub.FetchSnapshot(request, timeout=RPC_TIMEOUT_S))
        blob = blob_from_proto(response.blob)
        if blob.key != (rank, step):
            raise PeerUnavailable(f"{address} answered rank {blob.rank} step {blob.step} for rank {rank} step {step}")
        await asyncio.to_thread(verify, blob)  # seconds for a model-sized payload: off the event loop
        return blob

    async def _retry(
        self, address: str, backoff: Backoff, call: Callable[[peer_pb2_grpc.AgentPeerStub], Awaitable[T]]
    ) -> T:
        """Retries UNAVAILABLE-like failures with jittered backoff until the policy's deadline."""
        waited_s = 0.0
        attempt = 0
        while True:
            try:
                return await call(self._stub(address))
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    raise SnapshotMissing(f"{address}: {exc.details()}") from exc
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise PeerUnavailable(f"{address} rejected the request: {exc.details()}") from exc
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
            await channel.close()
        self._channels.clear()
