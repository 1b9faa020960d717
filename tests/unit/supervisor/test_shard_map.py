"""Rendezvous hashing of nodes over replicas: every host agrees, the spread is even, and a dead
replica's nodes (only those) move, spread over the survivors."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftsup.common.shard_map import agent_holders, home_of, ranked, shard_of, weight

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


def test_the_leader_holds_no_agents_and_its_followers_split_them_evenly():
    leader = REPLICAS[0]
    homes = Counter(home_of(n, REPLICAS, me, leader=leader) for n in NODES[:3000] for me in (leader, REPLICAS[1]))
    assert set(homes) == set(REPLICAS[1:]), homes
    assert abs(homes[REPLICAS[1]] - homes[REPLICAS[2]]) < 0.06 * 3000, homes


def test_a_followers_death_moves_only_its_own_nodes_to_the_other_follower():
    leader, a, b = REPLICAS
    before = {n: home_of(n, REPLICAS, a, leader=leader) for n in NODES[:2000]}
    after = {n: home_of(n, [leader, a], a, leader=leader) for n in NODES[:2000]}  # b's membership expired
    moved = {n for n in before if before[n] != after[n]}
    assert moved == {n for n in before if before[n] == b} and set(after.values()) == {a}
    # before its membership expires, b's agents name it unreachable and land where they will stay
    assert all(home_of(n, REPLICAS, leader, unreachable=[b], leader=leader) == a for n in moved)


def test_an_agent_that_reached_only_the_leader_is_held_there():
    leader, *followers = REPLICAS
    assert all(home_of(n, REPLICAS, leader, unreachable=followers, leader=leader) == leader for n in NODES[:100])
    # one follower unreachable: the other takes the node, not the leader
    assert {home_of(n, REPLICAS, leader, unreachable=followers[:1], leader=leader) for n in NODES[:100]} == {followers[1]}


def test_an_unknown_leader_spares_nobody_and_alone_the_leader_holds_everyone():
    assert agent_holders([REPLICAS[0]], leader=REPLICAS[0]) == {REPLICAS[0]}
    assert agent_holders(REPLICAS, leader="") == set(REPLICAS)
    assert agent_holders(REPLICAS, leader="elsewhere:1") == set(REPLICAS)
