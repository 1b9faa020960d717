"""The failure detector's memo (core/detector_memo.py) skips passes, never verdicts.

Random histories of Hellos, heartbeats, shard summaries (a shard going quiet included), closed
streams, stalls, liveness changes, nodes added and configuration changes, fed through
`soft.observe` as the runtime feeds them, with Ticks in between at times that may run backwards
(inputs are decided as of their arrival): every Tick's verdicts equal a pass over the whole fleet
with an empty memo, in order. And the memo does skip: a quiet fleet is walked once per deadline,
not ten times a second."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core import frozen
from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core.config import DetectorConfig
from ftsup.supervisor.core.events import NodeRole
from ftsup.supervisor.core.inputs import AgentHello, HeardFrom, Heartbeat, StreamClosed, Tick
from ftsup.supervisor.core.policies import failure
from ftsup.supervisor.core.state import ClusterState, Liveness, NodeRecord, SoftState

NODES = ("n0", "n1", "n2", "n3")
CONFIGS = (DetectorConfig(heartbeat_interval_s=1.0, heartbeat_misses=2, reconnect_grace_s=0.4),
           DetectorConfig(heartbeat_interval_s=1.0, heartbeat_misses=1, reconnect_grace_s=0.4),
           DetectorConfig(heartbeat_interval_s=0.5, heartbeat_misses=3, reconnect_grace_s=1.0))


def _record(node_id: str, liveness: Liveness = Liveness.ALIVE) -> NodeRecord:
    return NodeRecord(node_id, 1, NodeRole.ACTIVE, "h", 9000, 8, liveness=liveness)


def _unmemoized(state: ClusterState, soft: SoftState, config: DetectorConfig, now: float) -> list[failure.Verdict]:
    """A pass over every node: the same soft state read through a SoftState with an empty memo."""
    fresh = SoftState(started_at_s=soft.started_at_s, nodes=soft.nodes, shard_heard_s=soft.shard_heard_s)
    verdicts = failure.judge(state, fresh, config, now)
    assert fresh.detector_memo.passes == 1
    return verdicts


steps = st.one_of(
    st.tuples(st.just("hello"), st.sampled_from(NODES), st.sampled_from(["", "s1"])),
    st.tuples(st.just("heartbeat"), st.sampled_from(NODES), st.just("")),
    st.tuples(st.just("summary"), st.lists(st.sampled_from(NODES), max_size=3), st.sampled_from(["", "s1"])),
    st.tuples(st.just("close"), st.sampled_from(NODES), st.just("")),
    st.tuples(st.just("stall"), st.sampled_from([0.3, 1.2]), st.just("")),
    st.tuples(st.just("liveness"), st.sampled_from(NODES), st.sampled_from(list(Liveness))),
    st.tuples(st.just("config"), st.integers(0, len(CONFIGS) - 1), st.just("")),
    st.tuples(st.just("tick"), st.just(""), st.just("")),
)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(steps, st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.7, 1.6, -0.2, -1.0])),
                min_size=1, max_size=40),
       st.sampled_from([0.0, 2.0]), st.integers(1, len(NODES)))
def test_every_ticks_verdicts_equal_a_whole_pass_with_an_empty_memo(history, started, registered):
    state = ClusterState(nodes=MappingProxyType({n: _record(n) for n in NODES[:registered]}))
    soft, config = SoftState(started_at_s=started), CONFIGS[0]
    streams = {node_id: i + 1 for i, node_id in enumerate(state.nodes)}
    for node_id, stream in streams.items():  # (a fleet that said Hello: the memo's common case)
        soft_state.observe(soft, state, AgentHello(node_id, 1, NodeRole.ACTIVE, "h", 9000, 8, stream), 0.0)
    now, ticks = 0.0, 0
    for (kind, what, extra), step_s in history:
        now += step_s  # (may step back: arrival times)
        if kind == "hello":
            streams[what] = len(streams) + 1
            soft_state.observe(soft, state, AgentHello(what, 1, NodeRole.ACTIVE, "h", 9000, 8, streams[what],
                                                       shard=extra), now)
            if what not in state.nodes:
                state = frozen.replace(state, nodes=MappingProxyType({**state.nodes, what: _record(what)}))
        elif kind == "heartbeat":
            soft_state.observe(soft, state, Heartbeat(what, 1, 0), now)
        elif kind == "summary":
            soft_state.observe(soft, state, HeardFrom(tuple(what), extra), now)
        elif kind == "close" and what in streams:
            soft_state.observe(soft, state, StreamClosed(what, 1, streams[what]), now)
        elif kind == "stall":
            soft_state.observe(soft, state, Tick(stalled_s=what), now)
        elif kind == "liveness" and what in state.nodes:
            changed = frozen.replace(state.nodes[what], liveness=extra)
            state = frozen.replace(state, nodes=MappingProxyType({**state.nodes, what: changed}))
        elif kind == "config":
            config = CONFIGS[what]
        elif kind == "tick":
            ticks += 1
            expected = _unmemoized(state, soft, config, now)
            assert repr(failure.judge(state, soft, config, now)) == repr(expected), f"at t={now:.2f}"
    memo = soft.detector_memo
    assert memo.passes + memo.partials + memo.skips == ticks


def test_a_quiet_fleet_is_walked_once_per_deadline_not_on_every_tick():
    config = CONFIGS[0]  # suspect after 1.5 s, dead after 2 s
    state = ClusterState(nodes=MappingProxyType({f"n{i}": _record(f"n{i}") for i in range(100)}))
    soft = SoftState(started_at_s=0.0)
    for i, node_id in enumerate(state.nodes):
        soft_state.observe(soft, state, AgentHello(node_id, 1, NodeRole.ACTIVE, "h", 9000, 8, i + 1), 0.0)
    seen: list[tuple[float, str, Liveness]] = []
    for tenth in range(1, 31):  # ten Ticks a second for 3 s, every node heard each second but n7
        now = tenth / 10
        if tenth % 10 == 0:
            soft_state.observe(soft, state, HeardFrom(tuple(n for n in state.nodes if n != "n7")), now)
        verdicts = failure.judge(state, soft, config, now)
        assert repr(verdicts) == repr(_unmemoized(state, soft, config, now))
        for verdict in verdicts:  # (folded as the core's events would be)
            changed = frozen.replace(state.nodes[verdict.node_id], liveness=verdict.liveness)
            state = frozen.replace(state, nodes=MappingProxyType({**state.nodes, verdict.node_id: changed}))
            seen.append((now, verdict.node_id, verdict.liveness))
    # n7 is suspected at 1.5 s and then looked at alone on every Tick until its death at 2 s; the
    # rest of the time the fleet is walked only when the oldest heartbeat's deadline comes.
    assert seen == [(1.5, "n7", Liveness.SUSPECT), (2.0, "n7", Liveness.DEAD)]
    memo = soft.detector_memo
    assert memo.passes + memo.partials + memo.skips == 30
    assert memo.passes <= 6, f"walked the fleet on {memo.passes} of 30 Ticks"
    assert memo.partials >= 3  # (n7's Ticks between its suspicion and its death: n7 alone)


@pytest.mark.parametrize("late", ["heartbeat", "summary", "hello"])
def test_a_node_heard_at_an_earlier_time_than_the_last_pass_saw_is_judged_on_that_time(late):
    """Inputs are decided as of their arrival, so a heartbeat that waited in the queue can set a
    node's clock back: its deadline comes earlier than the memo's, which must follow it."""
    config = CONFIGS[0]
    state = ClusterState(nodes=MappingProxyType({"n0": _record("n0"), "n1": _record("n1")}))
    soft = SoftState(started_at_s=-5.0)
    for stream, node_id in enumerate(state.nodes, 1):
        soft_state.observe(soft, state, AgentHello(node_id, 1, NodeRole.ACTIVE, "h", 9000, 8, stream), 0.0)
    assert failure.judge(state, soft, config, 1.0) == []  # (a pass: nothing due before 1.5)
    inp = {"heartbeat": Heartbeat("n0", 1, 0), "summary": HeardFrom(("n0",)),
           "hello": AgentHello("n0", 1, NodeRole.ACTIVE, "h", 9000, 8, 7)}[late]
    soft_state.observe(soft, state, inp, -1.0)
    verdicts = failure.judge(state, soft, config, 0.6)
    assert [(v.node_id, v.liveness) for v in verdicts] == [("n0", Liveness.SUSPECT)]
    assert repr(verdicts) == repr(_unmemoized(state, soft, config, 0.6))


def test_late_nodes_are_watched_alone_instead_of_making_every_tick_a_pass():
    """Nodes heard late but not yet suspect (a loaded fleet: here half of it, each heard every
    1.4 s, against a suspicion at 1.5 s) must not pull the fleet's next pass to every
    Tick: a node whose deadline is near is judged alone until it is heard, and the fleet is walked
    only when another node can be due."""
    config = CONFIGS[0]  # suspect after 1.5 s, dead after 2 s
    state = ClusterState(nodes=MappingProxyType({f"n{i}": _record(f"n{i}") for i in range(100)}))
    soft = SoftState(started_at_s=0.0)
    for i, node_id in enumerate(state.nodes):
        soft_state.observe(soft, state, AgentHello(node_id, 1, NodeRole.ACTIVE, "h", 9000, 8, i + 1), 0.0)
    for tenth in range(1, 81):  # eight seconds, each node heard once a second at its own tenth...
        now = tenth / 10
        heard = tuple(n for i, n in enumerate(state.nodes)  # (...the odd ones every 1.4 s at theirs)
                      if (tenth - i) % (14 if i % 2 else 10) == 0)
        soft_state.observe(soft, state, HeardFrom(heard), now)
        verdicts = failure.judge(state, soft, config, now)
        assert repr(verdicts) == repr(_unmemoized(state, soft, config, now))
        assert verdicts == []
    memo = soft.detector_memo
    # The fleet can be due every 0.4 s at most (the unwatched are silent < 1.2 s, suspect at 1.5):
    # 18 passes here; 34 when a node due soon set the next pass as any other.
    assert memo.passes <= 22, f"walked the fleet on {memo.passes} of 80 Ticks ({memo.partials} partial)"
    assert memo.partials >= 10
