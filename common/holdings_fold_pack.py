"""Several sessions' SnapshotHoldings of one step packed into one ShardHoldingsFold (issue 14, a link shard's side).

With a RAM snapshot every step, each node sends its own ranks' holdings and its buddy copies at
the end of a step, so a shard's batch to the leader holds many nodes' holdings of one step; packed,
the leader decodes one message per batch (supervisor/server/holdings_fold.py) instead of one per
node. The packing decides nothing: the columns are the parts' concatenated in order, and each part
is decided on the leader as its own message would be. Only holdings of the shape the leader's
decoding accepts are packed (`packable`): a malformed one goes up alone and is refused to its node.
"""

from __future__ import annotations

from collections.abc import Sequence

from ftsup.v1 import agent_pb2, shard_pb2


def packable(message: agent_pb2.SnapshotHoldings) -> bool:
    """One size and one digest per rank, at least one rank (supervisor/server/snapshot_holdings.py)."""
    count = len(message.ranks)
    return count > 0 and len(message.size_bytes) == count and len(message.sha256) == count


def pack(parts: Sequence[tuple[int, agent_pb2.SnapshotHoldings]]) -> shard_pb2.ShardHoldingsFold:
    """(session, holdings) pairs of one generation and step, each session once, each `packable`,
    as one fold in their order."""
    if not parts:
        raise ValueError("a holdings fold needs at least one part")
    first = parts[0][1]
    key = (first.generation, first.step)
    if any((h.generation, h.step) != key for _, h in parts) or len({s for s, _ in parts}) != len(parts):
        raise ValueError("a holdings fold holds each session's holdings of one generation's step once")
    if not all(packable(h) for _, h in parts):
        raise ValueError("a holdings fold packs only well-formed holdings")
    fold = shard_pb2.ShardHoldingsFold(generation=first.generation, step=first.step,
                                       sessions=[s for s, _ in parts], counts=[len(h.ranks) for _, h in parts])
    for _, holdings in parts:
        fold.ranks.extend(holdings.ranks)
        fold.size_bytes.extend(holdings.size_bytes)
        fold.sha256.extend(holdings.sha256)
    return fold


def unpack(fold: shard_pb2.ShardHoldingsFold) -> list[tuple[int, agent_pb2.SnapshotHoldings]]:
    """The (session, holdings) pairs a fold was packed from (tests; the leader decodes without them)."""
    out, start = [], 0
    for session, count in zip(fold.sessions, fold.counts):
        end = start + count
        out.append((session, agent_pb2.SnapshotHoldings(
            generation=fold.generation, step=fold.step, ranks=fold.ranks[start:end],
            size_bytes=fold.size_bytes[start:end], sha256=fold.sha256[start:end])))
        start = end
    return out
