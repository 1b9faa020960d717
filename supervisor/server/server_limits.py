"""Bounds on the supervisor's gRPC server: message sizes, concurrent RPCs, streams per connection.

Each is refused by gRPC itself with RESOURCE_EXHAUSTED and a reason that names the limit
("Received message larger than max (N vs. M)", "Concurrent RPC limit exceeded!"), before any
handler runs, so a flood costs the server neither a decode nor a slot in the runtime's queue.
Every agent holds one long-lived Connect stream, so the RPC cap is sized from the job: twice
its nodes (a reconnecting agent's old stream may linger until its close is seen; spares) plus
room for operators and health checks; `--max-concurrent-rpcs` overrides it.
"""

from __future__ import annotations

import grpc

# What an agent or operator sends is small (reports, commands; the largest, a link shard's batch
# of registrations, is ~100 bytes a node): 4 MiB, gRPC's own default, bounds what one message
# can make the server decode. Replies can be large (ListNodes of ~100k nodes): 16 MiB.
MAX_RECEIVE_BYTES = 4 * 1024 * 1024
MAX_SEND_BYTES = 16 * 1024 * 1024
# HTTP/2 streams one connection may open at once: an agent needs one, supervisorctl a few (a
# follow, a command); more waits in the client until one ends.
MAX_STREAMS_PER_CONNECTION = 32
OPERATOR_ROOM = 1024  # operator calls, follows, log relays and health checks beside the agents
# Agents ping their supervisor every heartbeat interval (>= 1 s, agent/link.py: keepalive_options)
# to notice one that stopped answering. gRPC's server takes pings more often than every 5 minutes
# while it sends no data (an agent's stream is quiet downstream) as abuse and ends the connection
# (GOAWAY "too_many_pings"); half the agents' shortest interval is allowed, faster is still abuse.
MIN_PING_INTERVAL_MS = 500


def default_max_concurrent_rpcs(nodes: int) -> int:
    """Every agent's stream twice over (reconnects, spares) plus room for operators."""
    return 2 * max(nodes, 1) + OPERATOR_ROOM


def server_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def make_server(max_concurrent_rpcs: int) -> grpc.aio.Server:
    """The supervisor's server with every bound above; `max_concurrent_rpcs` from the config."""
    if max_concurrent_rpcs < 1:
        raise ValueError(f"max_concurrent_rpcs must be >= 1, got {max_concurrent_rpcs}")
    return grpc.aio.server(options=server_options(), maximum_concurrent_rpcs=max_concurrent_rpcs)
