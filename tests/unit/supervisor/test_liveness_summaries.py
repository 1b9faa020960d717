"""A link shard's liveness summary (HeardFrom) is, to the leader's core, exactly the heartbeats it
stands for: the same soft state and the same verdicts on every later Tick, whatever the fleet
does (issue 14: the leader handles one input per shard batch instead of one per node)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core.inputs import HeardFrom, Heartbeat, Tick
from ftsup.supervisor.core.limits import MAX_HEARD_NODES, MAX_SHARD_NAME, MAX_SHARDS
from ftsup.supervisor.core.policies.failure import QUIET_SHARD_AFTER_S, SHARD_QUIET_LIMIT
from ftsup.supervisor.shard import SHARD_KEEPALIVE_S
from tests.support.builders import NOW, Sim, config, hello

NODES = ("n0", "n1", "n2", "n3")


def started() -> Sim:
    sim = Sim(config(nodes=3, ranks_per_node=1))
    for node in NODES:
        sim.events(hello(node, spare=node == "n3"))
    sim.events(Tick(), at=NOW + 0.1)
    assert sim.state.generation is not None
    return sim


# Per round: which nodes were heard, and how far the clock moves before the Tick that judges them.
rounds = st.lists(st.tuples(st.frozensets(st.sampled_from(NODES)), st.sampled_from((0.3, 0.7, 1.1, 2.5))),
                  min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(rounds)
def test_a_summary_decides_exactly_what_the_heartbeats_it_stands_for_decide(script):
    one_by_one, summarised = started(), started()
    t = NOW + 0.1
    for heard, advance in script:
        t += advance
        alive = sorted(n for n in heard if n in one_by_one.soft.nodes)
        for node in alive:
            one_by_one.feed(Heartbeat(node, 1, 0), at=t)
        # (a summary may name a node the core does not know: skipped, not refused)
        assert summarised.feed(HeardFrom((*alive, "never-said-hello")), at=t) == []
        assert one_by_one.feed(Tick(), at=t + 0.05) == summarised.feed(Tick(), at=t + 0.05)
        assert ({n: s.last_heard_s for n, s in one_by_one.soft.nodes.items()}
                == {n: s.last_heard_s for n, s in summarised.soft.nodes.items()})
    assert one_by_one.state == summarised.state


@pytest.mark.parametrize("shard", ["", "shard-a:9000"])
def test_a_silent_node_left_out_of_every_summary_is_declared_dead_as_if_it_sent_nothing(shard):
    sim = started()
    t = NOW + 0.1
    verdicts = []
    while t < NOW + 10:
        t += 0.5
        sim.feed(HeardFrom(("n0", "n1", "n3"), shard), at=t)
        verdicts += [type(e).__name__ for e in sim.events(Tick(), at=t)]
    assert "NodeDeclaredDead" in verdicts and sim.state.nodes["n2"].is_quarantined
    assert not any(sim.state.nodes[n].is_quarantined for n in ("n0", "n1", "n3"))


def test_a_summary_naming_more_nodes_than_any_fleet_has_is_refused_whole():
    sim = started()
    refused = sim.feed(HeardFrom(tuple(f"n{i}" for i in range(MAX_HEARD_NODES + 1))))
    assert isinstance(refused, str) and str(MAX_HEARD_NODES) in refused


# -- a shard's quiet is the shard's (issue 14): the detector config of these tests is 1 s
# heartbeats, dead after 3 s of silence, suspect after 1.5 s.
SHARD = "shard-a:9000"
DEAD_AFTER_S = 3.0


def _talking_until(sim: Sim, shard: str, until: float) -> float:
    """The shard names every node every 0.2 s (heartbeats at 1 s, summaries at its keepalive
    pace) up to `until`, with a Tick after each summary; returns the last summary's time."""
    t = NOW + 0.1
    while t + 0.2 <= until:
        t += 0.2
        assert sim.feed(HeardFrom(NODES, shard), at=t) == []
        assert sim.events(Tick(), at=t + 0.01) == []
    return t


def _verdicts(sim: Sim, start: float, end: float, step: float = 0.1) -> list[tuple[float, str, str]]:
    """(time, kind, node) of each suspicion and death decided by Ticks every `step` in [start, end)."""
    found = []
    t = start
    while t < end:
        for event in sim.events(Tick(), at=t):
            if type(event).__name__ in ("NodeSuspected", "NodeDeclaredDead"):
                found.append((round(t, 2), type(event).__name__, event.node_id))
        t += step
    return found


def test_the_keepalive_fits_the_quiet_rule_twice_over():
    assert 2 * SHARD_KEEPALIVE_S <= QUIET_SHARD_AFTER_S


@pytest.mark.parametrize(("shard", "judged"), [(SHARD, False), ("", True)])
def test_nodes_behind_a_quiet_shard_are_not_judged_on_its_quiet(shard, judged):
    """A shard quiet for longer than a node may be silent (its loop starved, its process stopped),
    then back: its nodes are neither suspected nor dead. The same quiet from a shard that does not
    keep alive ("": its quiet proves nothing) kills every node it holds, as before."""
    sim = started()
    last = _talking_until(sim, shard, NOW + 5)
    quiet_s = SHARD_QUIET_LIMIT * DEAD_AFTER_S + 0.3  # (the bound: that + QUIET_SHARD_AFTER_S)
    verdicts = _verdicts(sim, last + 0.1, last + quiet_s)
    t = last + quiet_s
    while t < last + quiet_s + 5:  # back, naming every node again
        if not any(kind == "NodeDeclaredDead" for _, kind, _ in verdicts):
            sim.feed(HeardFrom(NODES, shard), at=t)
        verdicts += _verdicts(sim, t + 0.01, t + 0.2)
        t += 0.2
    if judged:
        assert {node for _, kind, node in verdicts if kind == "NodeDeclaredDead"} == set(NODES)
    else:
        assert verdicts == []
        assert not any(n.is_quarantined for n in sim.state.nodes.values())


def test_a_shard_quiet_for_longer_than_a_node_may_be_is_gone_and_its_nodes_are_judged():
    sim = started()
    last = _talking_until(sim, SHARD, NOW + 5)
    verdicts = _verdicts(sim, last + 0.1, last + 10)
    deaths = {node: t for t, kind, node in verdicts if kind == "NodeDeclaredDead"}
    assert set(deaths) == set(NODES)
    gone_at = last + QUIET_SHARD_AFTER_S + SHARD_QUIET_LIMIT * DEAD_AFTER_S
    assert all(gone_at - 0.01 <= t <= gone_at + 0.15 for t in deaths.values()), (deaths, gone_at)


def test_a_node_silent_before_its_shard_went_quiet_is_forgiven_only_the_shards_quiet():
    """n2 stopped (its shard still speaking for the others), then the shard went quiet for 2 s and
    came back without n2: n2's silence is what the shard could hear, so it dies 2 s - 0.5 s later
    than it would have, not at once when the shard returns, and not never."""
    sim = started()
    t = _talking_until(sim, SHARD, NOW + 5)
    n2_last = t
    others = ("n0", "n1", "n3")
    for _ in range(5):  # one more second of the shard speaking, without n2
        t += 0.2
        sim.feed(HeardFrom(others, SHARD), at=t)
    quiet_s = 2.0
    verdicts = _verdicts(sim, t + 0.1, t + quiet_s)
    assert not [v for v in verdicts if v[1] == "NodeDeclaredDead"]
    t += quiet_s
    sim.feed(HeardFrom(others, SHARD), at=t)
    end = t + 4
    while t + 0.2 < end:
        t += 0.2
        sim.feed(HeardFrom(others, SHARD), at=t)
        verdicts += [(round(t, 2), type(e).__name__, e.node_id) for e in sim.events(Tick(), at=t + 0.01)
                     if type(e).__name__ == "NodeDeclaredDead"]
    deaths = [at for at, kind, node in verdicts if kind == "NodeDeclaredDead"]
    assert [node for _, kind, node in verdicts if kind == "NodeDeclaredDead"] == ["n2"]
    expected = n2_last + DEAD_AFTER_S + (quiet_s - QUIET_SHARD_AFTER_S)
    assert expected - 0.01 <= deaths[0] <= expected + 0.25, (deaths, expected)


def test_the_supervisors_own_stall_is_no_shards_quiet():
    sim = started()
    last = _talking_until(sim, SHARD, NOW + 5)
    assert sim.events(Tick(stalled_s=10.0), at=last + 10.1) == []
    assert sim.soft.shard_heard_s[SHARD] == last + 10.0
    assert _verdicts(sim, last + 10.2, last + 10.2 + QUIET_SHARD_AFTER_S + 0.05) == []


def test_a_shard_name_longer_than_any_address_is_refused_and_the_remembered_shards_are_bounded():
    sim = started()
    refused = sim.feed(HeardFrom(("n0",), "s" * (MAX_SHARD_NAME + 1)))
    assert isinstance(refused, str) and str(MAX_SHARD_NAME) in refused
    for index in range(MAX_SHARDS + 5):
        sim.feed(HeardFrom((), f"shard-{index}"), at=NOW + 1 + index * 1e-4)
    assert len(sim.soft.shard_heard_s) == MAX_SHARDS
    assert "shard-0" not in sim.soft.shard_heard_s and f"shard-{MAX_SHARDS + 4}" in sim.soft.shard_heard_s


def test_a_relayed_hello_names_its_shard_so_the_quiet_rule_holds_before_its_first_summary():
    """A node that (re)connects through a shard just before the shard goes quiet (its Hello
    relayed, its first heartbeat not yet summarised) is the shard's from its Hello on."""
    sim = started()
    last = _talking_until(sim, SHARD, NOW + 5)
    sim.events(replace(hello("n4", spare=True), shard=SHARD),
               at=last + 0.1)
    assert sim.soft.nodes["n4"].shard == SHARD
    verdicts = _verdicts(sim, last + 0.2, last + SHARD_QUIET_LIMIT * DEAD_AFTER_S)
    assert verdicts == []
    assert isinstance(msg := sim.feed(replace(hello("n5", spare=True), shard="s" * (MAX_SHARD_NAME + 1))), str)
    assert str(MAX_SHARD_NAME) in msg
