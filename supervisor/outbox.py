"""One agent stream's outbound queue: bounded, and closable with a reason.

The runtime (directives) and the agent service (refusals, heartbeat acks) put messages here; the
stream's gRPC handler sends them. A client that stops reading must not grow the supervisor's
memory: when the queue is full, `put` refuses and marks the stream overflowed, and the handler
ends the stream with RESOURCE_EXHAUSTED (a reconnecting agent gets fresh directives, which are a
projection of state, so nothing is lost). The end-of-stream marker always fits.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol

from ftsup.v1 import agent_pb2

# Directives change once per generation and acks/refusals answer what the agent sends (itself
# bounded by the per-stream in-flight limit): a healthy stream holds a handful.
OUTBOX_CAPACITY = 1024


class SharedSender(Protocol):
    """Where one message meant for several streams goes once (a link shard's relay: the shard
    delivers it to each of the sessions named)."""

    def put_shared(self, sessions: list[int], message: agent_pb2.SupervisorMessage) -> bool: ...


class StreamOutbox:
    def __init__(self, capacity: int = OUTBOX_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"outbox capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: collections.deque[agent_pb2.SupervisorMessage] = collections.deque()
        self._ready = asyncio.Event()
        self.is_closed = False
        self.close_reason = ""  # set when the supervisor ends the stream for a limit (not a plain close)
        # The node's link shard probes its agent (supervisor/agent_probe.py) and reports it gone:
        # this supervisor then never connects to that node's peer port itself.
        self.probed_by_shard = False

    def put(self, message: agent_pb2.SupervisorMessage) -> bool:
        """Queues `message`; False (and the stream is closed as overflowed) when the queue is full."""
        if self.is_closed:
            return False
        if len(self._items) >= self.capacity:
            self.close(f"outbound queue full ({self.capacity} messages): the agent is not reading its stream")
            return False
        self._items.append(message)
        self._ready.set()
        return True

    def close(self, reason: str = "") -> None:
        """Ends the stream after what is queued; a non-empty reason is sent as the stream's status."""
        if not self.is_closed:
            self.is_closed = True
            self.close_reason = reason
        self._ready.set()

    def shared_route(self) -> tuple[SharedSender, int] | None:
        """Where a message meant for many streams may be sent once for this one too, and this
        stream's address there; None (an agent's own stream): `put` it here."""
        return None

    async def get(self) -> agent_pb2.SupervisorMessage | None:
        """The next message, or None once the stream is closed (a limit closes it at once)."""
        while True:
            if self.close_reason:
                return None
            if self._items:
                return self._items.popleft()
            if self.is_closed:
                return None
            self._ready.clear()
            await self._ready.wait()

    def __len__(self) -> int:
        return len(self._items)
