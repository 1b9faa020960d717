"""A link shard's liveness summary (HeardFrom) is, to the leader's core, exactly the heartbeats it
stands for: the same soft state and the same verdicts on every later Tick, whatever the fleet
does (issue 14: the leader handles one input per shard batch instead of one per node)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core.inputs import HeardFrom, Heartbeat, Tick
from ftsup.supervisor.core.limits import MAX_HEARD_NODES
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


def test_a_silent_node_left_out_of_every_summary_is_declared_dead_as_if_it_sent_nothing():
    sim = started()
    t = NOW + 0.1
    verdicts = []
    while t < NOW + 10:
        t += 0.5
        sim.feed(HeardFrom(("n0", "n1", "n3")), at=t)
        verdicts += [type(e).__name__ for e in sim.events(Tick(), at=t)]
    assert "NodeDeclaredDead" in verdicts and sim.state.nodes["n2"].is_quarantined
    assert not any(sim.state.nodes[n].is_quarantined for n in ("n0", "n1", "n3"))


def test_a_summary_naming_more_nodes_than_any_fleet_has_is_refused_whole():
    sim = started()
    refused = sim.feed(HeardFrom(tuple(f"n{i}" for i in range(MAX_HEARD_NODES + 1))))
    assert isinstance(refused, str) and str(MAX_HEARD_NODES) in refused
