"""The one core step (core/step.py): what `Core.step` hands the shell, what `advance` folds, and
that the unit-test driver, the simulator and the runtime now share it (the drift it ended)."""

from __future__ import annotations

import dataclasses

import pytest

from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core import taint
from ftsup.supervisor.core.directives import directives_for
from ftsup.supervisor.core.errors import InvalidEvent
from ftsup.supervisor.core.events import EndReason, GenerationEnded, GenerationRunning, NodeRegistered, SdcSuspected
from ftsup.supervisor.core.evolve import evolve
from ftsup.supervisor.core.inputs import Heartbeat, StepReport, StreamClosed, Tick
from ftsup.supervisor.core.policies.sdc import SdcConfig
from ftsup.supervisor.core.state import NOTHING_OBSERVED, is_usable
from ftsup.supervisor.core.step import RefusalKind, affected_nodes
from tests.support.builders import NOW, Sim, config, hello


def _running(cfg=None) -> Sim:
    sim = Sim(cfg or config())
    for i in (1, 2, 3):
        sim.events(hello(f"n{i}", stream_id=i))
    sim.events(hello("s1", spare=True, stream_id=9))
    assert sim.state.generation is not None
    return sim


def test_a_refused_input_comes_back_as_a_permanent_refusal_with_its_reason_and_changes_nothing():
    sim = _running()
    state, applied = sim.state, sim.state.applied_seq
    ready = sim.core.step(Heartbeat("nobody", 1, 0), NOW)
    assert ready.refusal is not None and ready.refusal.kind is RefusalKind.PERMANENT
    assert "has not said Hello" in ready.refusal.reason and not ready.refusal.is_retryable
    assert ready.events == () and ready.affected == ()
    assert sim.state is state and sim.state.applied_seq == applied
    assert "nobody" not in sim.soft.nodes


def test_a_heartbeat_is_observed_but_decides_and_touches_nothing():
    sim = _running()
    ready = sim.core.step(Heartbeat("n1", 1, 0), NOW + 0.5)
    assert ready.refusal is None and ready.events == () and ready.affected == ()
    assert ready.waiting_reason == sim.core.waiting_reason
    assert sim.soft.nodes["n1"].last_heard_s == NOW + 0.5


def test_a_new_nodes_hello_touches_only_its_own_directive():
    sim = Sim()
    ready = sim.core.step(hello("n1", stream_id=1), NOW)
    assert [type(e) for e in ready.events] == [NodeRegistered]
    assert set(ready.affected or ()) == {"n1"}
    assert ready.waiting_reason.startswith("waiting for 3 active nodes")


def test_an_ended_generation_may_touch_every_nodes_directive():
    sim = _running()
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 1.0)
    sim.events(Tick(), at=NOW + 1.1)  # suspected
    ready = sim.core.step(Tick(), NOW + 2.5)  # declared dead after the reconnect grace
    assert any(isinstance(e, GenerationEnded) for e in ready.events)
    assert ready.affected is None


def test_a_generation_running_changes_no_directive_and_touches_nobody():
    """Its first step is no directive's field: at 12,500 nodes the push it caused re-sent every
    directive, unchanged, in one turn of the leader's loop."""
    sim = _running()
    generation = sim.state.generation
    assert generation is not None and not generation.is_running
    nodes = sorted(sim.state.nodes)
    before = directives_for(sim.state, sim.core.config.job, nodes, sim.core.waiting_reason)
    running = GenerationRunning(generation.number, first_step=1)
    assert affected_nodes(sim.state, [running]) == ()
    after = evolve(sim.state, running)
    assert after.generation is not None and after.generation.is_running
    assert directives_for(after, sim.core.config.job, nodes, sim.core.waiting_reason) == before


def test_advance_folds_only_the_records_of_the_ready_it_is_given():
    sim = Sim()
    ready = sim.core.step(hello("n1", stream_id=1), NOW)
    with pytest.raises(InvalidEvent, match="persist exactly ready.events"):
        sim.core.advance(ready, [])
    assert sim.state.applied_seq == 0
    sim.core.advance(ready, sim.core.records(ready.events, NOW))
    assert sim.state.applied_seq == 1 and "n1" in sim.state.nodes


def test_the_test_driver_votes_with_the_configured_model_parallel_groups():
    """Ranks 0, 2 and 1, 3 hold different shards under model_parallel_size=2: digests a, b, a, b
    agree. (The driver once observed with the default SDC config and called it a split.)"""
    cfg = dataclasses.replace(config(nodes=4, ranks_per_node=1), sdc=SdcConfig(model_parallel_size=2))
    sim = Sim(cfg)
    for i in (1, 2, 3, 4):
        sim.events(hello(f"n{i}", stream_id=i))
    generation = sim.state.generation
    assert generation is not None
    events = []
    for rank, digest in enumerate(("a", "b", "a", "b")):
        node = generation.node_of_rank(rank)
        events += sim.events(StepReport(node, generation.number, rank, 1, 0.1, 0.05, 2.0, digest))
    assert not any(isinstance(e, SdcSuspected) for e in events)
    assert sim.state.sdc_tainted_from_step is None


def test_the_test_driver_keeps_the_young_daly_observations_the_runtime_keeps():
    sim = _running()
    assert sim.core.interval_obs.job_started_s == NOW  # the first GenerationStarted, at its record's time
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 1.0)
    sim.events(Tick(), at=NOW + 1.1)
    ended = [e for e in sim.events(Tick(), at=NOW + 2.5) if isinstance(e, GenerationEnded)]
    assert [e.reason for e in ended] == [EndReason.NODE_LOST]
    assert len(sim.core.interval_obs.failures) == 1
    assert sim.soft.interval_obs is sim.core.interval_obs  # what checkpoints.on_tick reads


def test_observe_hands_the_vote_of_the_step_it_completed_to_decide_as_a_value():
    sim = Sim(config(nodes=4, ranks_per_node=1))
    for i in (1, 2, 3, 4):
        sim.events(hello(f"n{i}", stream_id=i))
    generation = sim.state.generation
    assert generation is not None
    seen = []
    for rank in range(4):
        report = StepReport(generation.node_of_rank(rank), generation.number, rank, 1, 0.1, 0.05, 2.0, "d1")
        seen.append(soft_state.observe(sim.soft, sim.state, report, NOW, sim.config.straggler, sim.config.sdc))
    assert seen[:3] == [NOTHING_OBSERVED] * 3  # the step waits for its last rank
    vote = seen[3].sdc_vote
    assert vote is not None and vote.step == 1 and vote.is_clear
    assert [d.rank for d in seen[3].vote_reports] == [0, 1, 2, 3]
    assert len(seen[3].straggler_verdicts) == 0  # scored, nobody slow


def test_a_node_is_usable_only_alive_in_service_and_connected():
    sim = _running()
    assert all(is_usable(sim.state.nodes[n], sim.soft) for n in ("n1", "n2", "n3", "s1"))
    sim.events(StreamClosed("s1", 1, 9), at=NOW + 1.0)
    node = sim.state.nodes["s1"]
    assert node.can_train and not is_usable(node, sim.soft)  # the log says fine; the stream is gone
    drained = dataclasses.replace(sim.state.nodes["n1"], is_drained=True)
    assert not drained.can_train and not is_usable(drained, sim.soft)


def test_a_step_is_tainted_from_the_first_divergent_step_on():
    assert not taint.covers(None, 10)
    assert not taint.covers(5, 4) and taint.covers(5, 5) and taint.covers(5, 6)
