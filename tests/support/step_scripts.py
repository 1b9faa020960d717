"""Random training histories for the tests that feed one step's reports two ways (per rank, per
node aggregate, per fold of several nodes) and require the same decisions."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from ftsup.supervisor.core.inputs import Tick
from tests.support.builders import NOW, Sim, config, hello

# Steps 1.. in order, each (step, slow rank or None, corrupt rank or None, a seed for its order).
STEP_SCRIPTS = st.lists(
    st.tuples(st.sampled_from([None, None, 3]), st.sampled_from([None, None, None, None, 5]), st.integers(0, 1000)),
    min_size=1, max_size=30,
).map(lambda rows: [(i + 1, slow, bad, seed) for i, (slow, bad, seed) in enumerate(rows)])


def started_job(nodes: int, ranks_per_node: int, *, spare: bool = False) -> Sim:
    """A running generation of `nodes` x `ranks_per_node` (checkpoints every 3 steps), nodes n0..;
    with `spare`, a node "spare" that said Hello and holds no rank."""
    cfg = dataclasses.replace(config(nodes=nodes, ranks_per_node=ranks_per_node), checkpoint_location="s3://b/ck",
                              checkpoint_every_steps=3)
    sim = Sim(cfg)
    for i in range(nodes):
        sim.events(hello(f"n{i}", stream_id=i + 1), at=NOW)
    if spare:
        sim.events(hello("spare", stream_id=nodes + 1), at=NOW)
    sim.events(Tick(), at=NOW + 0.1)
    assert sim.state.generation is not None
    return sim


def assert_same_decisions(one: Sim, other: Sim) -> None:
    """The same events in order, the same state, and the same soft state the detectors keep."""
    assert other.log == one.log
    assert other.state == one.state
    a, b = other.soft.progress, one.soft.progress
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert a.straggler == b.straggler
        assert a.sdc_clear_steps == b.sdc_clear_steps
        assert a.sdc_diverged_step == b.sdc_diverged_step
        assert (a.max_step, a.step_time_s, a.last_loss, a.step_reports) == (
            b.max_step, b.step_time_s, b.last_loss, b.step_reports)
        assert sorted(a.open_times) == sorted(b.open_times) and sorted(a.open_votes) == sorted(b.open_votes)
    assert {n: s.last_heard_s for n, s in other.soft.nodes.items()} == {
        n: s.last_heard_s for n, s in one.soft.nodes.items()}
