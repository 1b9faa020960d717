"""Operator.StreamLogs: a rank's output, relayed from the agent that ran it (AgentPeer.TailLog).

Why a relay over the agent's peer port rather than over the agent's Connect stream: the operator
talks only to supervisors (one authentication and authorization point, any replica answers), while
an agent's control stream reaches the leader alone and carries heartbeats, which a burst of
output must never hold up. A gRPC call per tail gives flow control end to end (the agent reads
the file only as fast as the operator drains the relay; nothing is buffered here beyond one
message) and cancellation end to end (the operator's cancel cancels this handler, whose `finally`
cancels the agent call and closes its channel, which ends the agent's tail and closes the file).
Identity: with mTLS the relay presents this replica's certificate (a supervisor identity, which
is what the agent's TailLog accepts) and dials the node by its identity host name, so the
handshake refuses anything but that node's certificate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from ftsup.common.tls import TlsFiles, channel_credentials, expect_node
from ftsup.supervisor.core.state import ClusterState
from ftsup.v1 import operator_pb2, peer_pb2, peer_pb2_grpc

MAX_RELAYS = 32  # concurrent StreamLogs calls on one replica
DEFAULT_LINES = 100  # backlog lines when the request does not say (the agent caps what is asked)


class RelayRefused(Exception):
    """The request names no rank this replica can find; `code` says how (INVALID_ARGUMENT, NOT_FOUND...)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def target_of(state: ClusterState, request: operator_pb2.StreamLogsRequest) -> tuple[str, int, int]:
    """(node id, rank, generation) a request names, from the rank map of the generation in force;
    RelayRefused names what is missing."""
    generation = state.generation
    rank = request.rank if request.HasField("rank") else None
    in_force = generation.number if generation is not None else 0
    wanted = request.generation or in_force
    node_id = request.node_id
    if not node_id:
        if rank is None:
            raise RelayRefused(grpc.StatusCode.INVALID_ARGUMENT, "name a rank (--rank) or a node (--node)")
        if generation is None or wanted != in_force:
            raise RelayRefused(grpc.StatusCode.FAILED_PRECONDITION,
                               f"rank {rank}: no rank map for generation {wanted or 'none'} (only the generation"
                               " in force is known); name the node that ran it (--node)")
        found = generation.node_of_rank(rank)
        if found is None:
            raise RelayRefused(grpc.StatusCode.NOT_FOUND,
                               f"generation {in_force} has no rank {rank} (world size {generation.world_size})")
        node_id = found
    if state.node(node_id) is None:
        raise RelayRefused(grpc.StatusCode.NOT_FOUND, f"no node {node_id!r} registered")
    if rank is None:
        member = generation.member(node_id) if generation is not None and wanted == in_force else None
        ranks = tuple(member.ranks) if member is not None else ()
        if len(ranks) != 1:
            raise RelayRefused(grpc.StatusCode.INVALID_ARGUMENT,
                               f"node {node_id} runs ranks {list(ranks)} in generation {wanted or 'none'}:"
                               " name one with --rank")
        rank = ranks[0]
    return node_id, rank, wanted


class LogRelay:
    def __init__(self, state: Callable[[], ClusterState], client_tls: TlsFiles | None, *,
                 max_relays: int = MAX_RELAYS) -> None:
        self._state = state
        self._credentials = channel_credentials(client_tls) if client_tls is not None else None
        self._max_relays = max_relays
        self.relays = 0  # calls in progress

    async def stream(self, request: operator_pb2.StreamLogsRequest) -> AsyncIterator[peer_pb2.LogLines]:
        """The agent's messages, passed on one at a time; raises RelayRefused or the agent's RpcError."""
        state = self._state()
        node_id, rank, generation = target_of(state, request)
        node = state.node(node_id)
        assert node is not None
        if self.relays >= self._max_relays:
            raise RelayRefused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"{self.relays} log streams run on this supervisor already (at most {self._max_relays})")
        self.relays += 1
        address = node.peer_address
        channel = (grpc.aio.secure_channel(address, self._credentials, options=expect_node(node_id))
                   if self._credentials is not None else grpc.aio.insecure_channel(address))
        call = peer_pb2_grpc.AgentPeerStub(channel).TailLog(peer_pb2.TailLogRequest(
            rank=rank, generation=generation, follow=request.follow,
            lines=request.lines if request.HasField("lines") else DEFAULT_LINES))
        try:
            async for message in call:
                yield message
        finally:  # the operator cancelled, the agent ended, or it failed: release the call and its channel
            call.cancel()
            await channel.close(None)  # no grace: the call is already cancelled
            self.relays -= 1
