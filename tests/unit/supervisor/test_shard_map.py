"""Rendezvous hashing of nodes over replicas: every host agrees, the spread is even, and a dead
replica's nodes (only those) move, spread over the survivors."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftsup.common.shard_map import ranked, shard_of, weight

NODES = [f"node-{i:05d}" for i in range(12_500)]
REPLICAS = ["sup-a:7000", "sup-b:7000", "sup-c:7000"]


def test_the_answer_is_the_same_in_every_process_and_for_any_order_of_replicas():
    # Fixed values: BLAKE2b, not Python's per-process salted hash.
    assert weight("node-00001", "sup-a:7000") == weight("node-00001", "sup-a:7000")
    assert shard_of("node-00001", REPLICAS) == shard_of("node-00001", list(reversed(REPLICAS)))
    assert weight("ab", "c") != weight("a", "bc"), "the names are length-prefixed"


def test_12500_nodes_spread_evenly_over_three_replicas():
    counts = Counter(shard_of(n, REPLICAS) for n in NODES)
    assert set(counts) == set(REPLICAS)
    assert max(counts.values()) - min(counts.values()) < 0.06 * len(NODES) / 3, counts


def test_a_dead_replicas_nodes_move_and_no_other_node_does():
    before = {n: shard_of(n, REPLICAS) for n in NODES}
    survivors = [r for r in REPLICAS if r != "sup-b:7000"]
    after = {n: shard_of(n, survivors) for n in NODES}
    moved = [n for n in NODES if before[n] != after[n]]
    assert set(moved) == {n for n in NODES if before[n] == "sup-b:7000"}
    spread = Counter(after[n] for n in moved)
    assert set(spread) == set(survivors) and min(spread.values()) > 0.4 * len(moved), spread
    assert all(after[n] == ranked(n, REPLICAS)[1] for n in moved), "each moves to its next choice"


@given(st.text(min_size=1, max_size=20), st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=6, unique=True))
def test_the_shard_is_the_first_of_the_nodes_ranked_replicas(node_id, replicas):
    order = ranked(node_id, replicas)
    assert sorted(order) == sorted(replicas)
    assert shard_of(node_id, replicas) == order[0]


def test_no_replica_is_a_clear_error():
    with pytest.raises(ValueError, match="no live replica"):
        shard_of("n1", [])
