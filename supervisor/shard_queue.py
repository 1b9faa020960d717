"""What a link shard has yet to send the leader: its agents' messages, batched, heartbeats folded.

A shard forwards everything that can change a decision in the order its agents sent it (Hellos,
reports, stream ends). Heartbeats only refresh the leader's liveness soft state, so a session's
heartbeats waiting together are folded into its newest one: under load the leader gets one per
node per batch, however far behind the stream is. The queue is bounded; when it is full the shard
ends the stream of whoever sent the message that did not fit (its agent reconnects), instead of
growing without limit or dropping a report silently.
"""

from __future__ import annotations

from ftsup.v1 import agent_pb2, shard_pb2

# Messages waiting for the leader at most: a whole 4,000-node shard's reconnect burst (Hello,
# resync and sticky facts, ~10 messages a node) fits; a leader that stops reading does not grow it.
UP_CAPACITY = 100_000
# Items per ShardBatch at most: keeps a batch far below the 16 MiB message limit (an item is a
# few hundred bytes; a step aggregate of 8 ranks ~1 KiB).
MAX_BATCH_ITEMS = 4_096


class UpQueue:
    """Forwarded items in arrival order, a session's queued heartbeats folded into its newest."""

    def __init__(self, capacity: int = UP_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"up-queue capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: list[shard_pb2.Forwarded | None] = []
        self._heartbeat_at: dict[int, int] = {}  # session -> index of its queued heartbeat
        self.folded = 0  # heartbeats replaced by a newer one of the same session (a counter)

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: shard_pb2.Forwarded) -> bool:
        """Queues `item`; False when the queue is full (the caller ends that agent's stream)."""
        if item.WhichOneof("kind") == "message" and item.message.WhichOneof("kind") == "heartbeat":
            at = self._heartbeat_at.get(item.session)
            if at is not None:
                self._items[at] = item  # newer seq, same session: the older one says nothing more
                self.folded += 1
                return True
            if len(self._items) >= self.capacity:
                return False
            self._heartbeat_at[item.session] = len(self._items)
            self._items.append(item)
            return True
        if len(self._items) >= self.capacity:
            return False
        if item.WhichOneof("kind") == "closed":
            self._heartbeat_at.pop(item.session, None)  # a later heartbeat of it would be stale
        self._items.append(item)
        return True

    def take(self, max_items: int = MAX_BATCH_ITEMS) -> list[shard_pb2.Forwarded]:
        """Up to `max_items` items, oldest first, removed from the queue."""
        head, rest = self._items[:max_items], self._items[max_items:]
        self._items = rest
        self._heartbeat_at = {s: i - len(head) for s, i in self._heartbeat_at.items() if i >= len(head)}
        return [item for item in head if item is not None]

    def clear(self) -> None:
        self._items.clear()
        self._heartbeat_at.clear()


def forwarded(session: int, node_id: str, incarnation: int,
              message: agent_pb2.AgentMessage | None = None, *, moved: bool | None = None) -> shard_pb2.Forwarded:
    """One item: an agent's message, or (moved set) the end of its session."""
    if message is not None:
        return shard_pb2.Forwarded(session=session, node_id=node_id, incarnation=incarnation, message=message)
    return shard_pb2.Forwarded(session=session, node_id=node_id, incarnation=incarnation,
                               closed=shard_pb2.ShardSessionEnd(moved=bool(moved)))
