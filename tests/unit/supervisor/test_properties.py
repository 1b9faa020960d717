"""Properties of the pure core over random input sequences (hypothesis).

Whatever agents say and whenever time passes: decide never emits an event evolve rejects, no
node is both in a generation and quarantined, no rank is held twice, and replaying the emitted
events from scratch gives the state the supervisor acted on.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.inputs import (
    Heartbeat,
    OperatorRequest,
    RankFinished,
    SnapshotReport,
    StepReport,
    StreamClosed,
    Tick,
    TrainerExit,
    TrainerHung,
    XidReport,
)
from ftsup.supervisor.core.state import ClusterState
from tests.support.builders import NOW, Sim, config, hello

NODES = ["n1", "n2", "n3", "s1"]
node_ids = st.sampled_from(NODES)
ranks = st.integers(0, 4)
gens = st.integers(1, 4)
steps = st.integers(0, 6)

inputs = st.one_of(
    st.builds(lambda n, inc: hello(n, spare=n.startswith("s"), incarnation=inc, stream_id=hash((n, inc)) % 97 + 1),
              node_ids, st.integers(1, 2)),
    st.builds(lambda n: Heartbeat(n, 1, 0), node_ids),
    st.builds(lambda n, g, r, s: StepReport(n, g, r, s, 0.1, 0.05, 1.0, "d"), node_ids, gens, ranks, steps),
    st.builds(lambda n, g, r, s, b: SnapshotReport(n, g, r, s, (n, b), 10), node_ids, gens, ranks, steps, node_ids),
    st.builds(lambda n, g, r, s: RankFinished(n, g, r, s, "d"), node_ids, gens, ranks, steps),
    st.builds(lambda n, g, r, f: TrainerExit(n, g, r, -9, f), node_ids, gens, ranks, st.booleans()),
    st.builds(lambda n, inc: StreamClosed(n, inc, hash((n, inc)) % 97 + 1), node_ids, st.integers(1, 2)),
    st.builds(lambda n, c: XidReport(n, "0000:3b:00", 0, c, "x"), node_ids, st.sampled_from([13, 31, 43, 48, 79, 999])),
    st.builds(lambda n, g, r: TrainerHung(n, g, r, 1, 100.0, 60.0), node_ids, gens, ranks),
    st.builds(lambda c, n: OperatorRequest(c, n, "why", "op"), st.sampled_from(["quarantine", "unquarantine", "drain"]),
              node_ids),
    st.just(Tick()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(inputs, st.floats(0.0, 2.0)), max_size=60))
def test_decisions_always_fold_and_keep_the_invariants(script):
    sim = Sim(config(nodes=2, ranks_per_node=2))
    now = NOW
    for inp, dt in script:
        now += dt
        sim.feed(inp, at=now)  # raises InvalidEvent if decide emitted an event evolve rejects
        state = sim.state
        if state.generation is not None:
            members = [m.node_id for m in state.generation.members]
            assert len(members) == len(set(members))
            held = sorted(r for m in state.generation.members for r in m.ranks)
            assert held == list(range(state.generation.world_size))
            for node_id in members:
                assert state.nodes[node_id].is_in_service
    replayed = evolve_all(ClusterState(), sim.log)
    assert replayed.nodes == sim.state.nodes
    assert replayed.generation == sim.state.generation
    assert replayed.snapshot == sim.state.snapshot


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(inputs, st.floats(0.0, 2.0)), max_size=60), st.floats(0.0, 1.0))
def test_replay_from_a_stored_snapshot_of_any_prefix_equals_replay_from_zero(script, cut):
    from ftsup.supervisor import codec
    from ftsup.supervisor.core.events import Record
    from ftsup.supervisor.core.evolve import apply_record

    sim = Sim(config(nodes=2, ranks_per_node=2))
    now = NOW
    for inp, dt in script:
        now += dt
        sim.feed(inp, at=now)
    records = [Record(i + 1, 0, 0.0, event) for i, event in enumerate(sim.log)]
    full = ClusterState()
    for record in records:
        full = apply_record(full, record)
    k = int(cut * len(records))
    prefix = ClusterState()
    for record in records[:k]:
        prefix = apply_record(prefix, record)
    restored = codec.state_from_proto(codec.state_to_proto(prefix))  # as a snapshot file holds it
    assert restored == prefix
    for record in records[k:]:
        restored = apply_record(restored, record)
    assert restored == full


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_evolve_is_total_any_event_either_folds_or_is_rejected_with_invalid_event(data):
    """Arbitrary (also nonsensical) events on reachable states: a new state or InvalidEvent, never a crash."""
    from ftsup.supervisor.core.errors import InvalidEvent
    from ftsup.supervisor.core.evolve import evolve
    from tests.support.strategies import STRATEGIES

    sim = Sim(config(nodes=2, ranks_per_node=2))
    now = NOW
    for inp, dt in data.draw(st.lists(st.tuples(inputs, st.floats(0.0, 2.0)), max_size=20)):
        now += dt
        sim.feed(inp, at=now)
    state = sim.state
    for event in data.draw(st.lists(st.one_of(*STRATEGIES.values()), max_size=10)):
        try:
            state = evolve(state, event)
        except InvalidEvent:
            pass
        assert evolve_all(ClusterState(), []) == ClusterState()
        if state.generation is not None:
            for member in state.generation.members:
                node = state.nodes.get(member.node_id)
                assert node is not None and node.is_in_service
