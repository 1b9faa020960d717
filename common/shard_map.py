"""Which replica's link shard holds which node: rendezvous (highest-random-weight) hashing.

Every replica and every agent computes the same answer from the same inputs (a node id and the
set of live replicas), with no table to replicate: each (node, replica) pair gets a weight from a
keyed hash and the node goes to the replica with the highest. When a replica dies only its own
nodes move (each to its next-highest replica), spread evenly over the survivors; a replica that
joins takes about 1/n of every other one's nodes. The hash is BLAKE2b, not Python's `hash`
(salted per process), so agents and replicas on different hosts agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(node_id: str, replica: str) -> int:
    """The pair's weight: 64 bits of BLAKE2b over both names (length-prefixed: no ambiguity)."""
    node, rep = node_id.encode(), replica.encode()
    digest = hashlib.blake2b(len(node).to_bytes(2, "big") + node + rep, digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shard_of(node_id: str, replicas: Iterable[str]) -> str:
    """The replica whose link shard holds `node_id` (ties, astronomically rare, to the lowest name)."""
    best: tuple[int, str] | None = None
    for replica in replicas:
        candidate = (weight(node_id, replica), replica)
        if best is None or candidate[0] > best[0] or (candidate[0] == best[0] and replica < best[1]):
            best = candidate
    if best is None:
        raise ValueError("no live replica to hold a link shard")
    return best[1]


def ranked(node_id: str, replicas: Iterable[str]) -> list[str]:
    """The replicas in the order `node_id` tries them: its shard first, then where it moves when
    that one dies, and so on (an agent whose shard is unreachable tries the next)."""
    return sorted(replicas, key=lambda replica: (-weight(node_id, replica), replica))


# With at least this many live replicas the leader holds no agents of its own: its followers hold
# them all and it handles only their relays (one stream each, liveness summaries, decisions), so
# the one process every decision waits on is not also the fleet's busiest gRPC server (measured:
# an agent stream costs its holder ~250-400 us of CPU per heartbeat, a summary ~0.05 us per node).
# Two is deliberate: a rule that gave the leader a share again once only one follower lived would
# change the holder set at a follower's death, moving about half of the survivor's nodes to the
# leader on top of the dead one's; as it is, a follower's death moves only its own nodes. Alone
# (every follower unreachable) the leader holds whoever reaches it.
SPARE_LEADER_FROM = 2


def agent_holders(live: Iterable[str], leader: str = "") -> set[str]:
    """The replicas whose link shards hold agents: the live ones, less the leader (when known) once
    SPARE_LEADER_FROM replicas are live."""
    replicas = set(live)
    if leader and leader in replicas and len(replicas) >= SPARE_LEADER_FROM:
        replicas.discard(leader)
    return replicas


def home_of(node_id: str, live: Iterable[str], me: str, unreachable: Iterable[str] = (), leader: str = "") -> str:
    """The shard replica `me` points `node_id`'s agent at: its shard among the replicas that hold
    agents (agent_holders; `me` counts as live) less those the agent says it could not reach
    (never `me`: the agent reached it). A dead shard's nodes so re-home at their first reconnect,
    before the dead replica's membership expires; an agent that reached only the leader is held
    there."""
    gone = set(unreachable) - {me}
    candidates = {replica for replica in agent_holders({*live, me}, leader) if replica not in gone}
    return shard_of(node_id, candidates or {me})
