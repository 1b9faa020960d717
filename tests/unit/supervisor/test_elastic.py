"""Elastic shrink and grow in the pure core: with no spare a lost node shrinks an elastic job to
the largest allowed world (a divisor of its nodes, at least min_nodes), ranks restore from RAM
as usual, trainers learn the full world (gradient accumulation); when nodes return the job
grows back at a committed snapshot, ranks without a copy of their own taking another rank's."""

from __future__ import annotations

import dataclasses

import pytest

from ftsup.supervisor.core.config import CoreConfig, JobSpec
from ftsup.supervisor.core.directives import directive_for
from ftsup.supervisor.core.events import (
    EndReason,
    GenerationEnded,
    GenerationStarted,
    NodeDeclaredDead,
    NodeQuarantined,
    RestoreKind,
)
from ftsup.supervisor.core.inputs import Heartbeat, StreamClosed, Tick
from tests.support.builders import NOW, Sim, config, hello
from tests.unit.supervisor.test_decide import alive, step


def elastic(nodes: int = 4, min_nodes: int = 1) -> CoreConfig:
    base = config(nodes=nodes, ranks_per_node=2)
    return dataclasses.replace(base, job=dataclasses.replace(base.job, min_nodes=min_nodes))


def running(nodes: int = 4, min_nodes: int = 1) -> Sim:
    sim = Sim(elastic(nodes, min_nodes))
    for i in range(1, nodes + 1):
        sim.events(hello(f"n{i}", stream_id=i))
    return sim


def kill(sim: Sim, node_id: str, stream_id: int, at: float) -> list:
    """The node's stream closes and it stays silent: the events of the ticks until its verdict."""
    alive(sim, at, silent=(node_id,))
    sim.events(StreamClosed(node_id, 1, stream_id), at=at)
    events = list(sim.events(Tick(), at=at + 0.1))
    alive(sim, at + 1.5, silent=(node_id,))
    return events + list(sim.events(Tick(), at=at + 1.6))


def test_allowed_worlds_divide_the_job_and_respect_min_nodes():
    job = JobSpec("j", 8, 2, ("x",), min_nodes=2)
    assert [job.shrunk_nodes(h) for h in (8, 7, 6, 5, 4, 3, 2, 1)] == [4, 4, 4, 4, 4, 2, 2, None]
    assert JobSpec("j", 8, 2, ("x",)).shrunk_nodes(7) is None  # not elastic: wait for nodes
    with pytest.raises(ValueError, match="min_nodes"):
        JobSpec("j", 4, 2, ("x",), min_nodes=5)
    assert JobSpec("j", 4, 2, ("x",), min_nodes=2).config_hash != JobSpec("j", 4, 2, ("x",)).config_hash


def test_without_a_spare_a_lost_node_shrinks_the_job_and_ranks_learn_the_full_world():
    sim = running()
    step(sim, 1, 1)
    step(sim, 1, 2)
    alive(sim, NOW + 4.0)
    events = kill(sim, "n4", 4, NOW + 5.0)
    kinds = [type(e) for e in events if type(e).__name__ != "NodeSuspected"]
    assert kinds == [NodeDeclaredDead, GenerationEnded, NodeQuarantined, GenerationStarted], events
    started = events[-1]
    # 3 healthy nodes; 3 does not divide 4: the largest allowed world is 2 nodes (4 ranks).
    assert started.world_size == 4 and [m.node_id for m in started.members] == ["n1", "n2"]
    assert started.restore_step == 2
    assert all(r.kind is RestoreKind.LOCAL_SNAPSHOT and r.source_rank is None for r in started.restores)
    assert "shrunk to 2 of 4 nodes" in started.reason and "accumulates 2 micro-batches" in started.reason
    env = dict((e.name, e.value) for e in directive_for(sim.state, sim.config.job, "n1", "").env)
    assert env["FTSUP_FULL_WORLD_SIZE"] == "8"


def test_a_job_that_is_not_elastic_waits_for_a_node_instead():
    sim = Sim(config(nodes=3, ranks_per_node=2))
    for i in (1, 2, 3):
        sim.events(hello(f"n{i}", stream_id=i))
    step(sim, 1, 1)
    events = kill(sim, "n3", 3, NOW + 5.0)
    assert not any(isinstance(e, GenerationStarted) for e in events)
    assert "need 3 healthy nodes, have 2" in sim.waiting_reason


def test_the_first_generation_waits_for_the_whole_world():
    sim = Sim(elastic())
    for i in (1, 2, 3):
        sim.events(hello(f"n{i}", stream_id=i))
    alive(sim, NOW + 60.0)
    assert not any(isinstance(e, GenerationStarted) for e in sim.events(Tick(), at=NOW + 60.1))


def test_returning_nodes_grow_the_job_back_at_a_committed_snapshot_from_replicated_copies():
    sim = running()
    step(sim, 1, 1)
    kill(sim, "n4", 4, NOW + 5.0)
    shrunk = sim.state.generation
    assert shrunk is not None and shrunk.world_size == 4
    alive(sim, NOW + 8.0)
    sim.events(hello("s9", spare=True, stream_id=99), at=NOW + 8.0)
    sim.events(Heartbeat("s9", 1, 0), at=NOW + 8.0)
    # No snapshot committed in the shrunk generation yet: it does not grow.
    assert not any(isinstance(e, GenerationEnded) for e in sim.events(Tick(), at=NOW + 8.1))
    step(sim, shrunk.number, 2, at=NOW + 8.2)
    events = sim.events(Tick(), at=NOW + 8.3)
    ended = [e for e in events if isinstance(e, GenerationEnded)]
    assert ended and ended[0].reason is EndReason.ELASTIC_GROW, events
    grown = [e for e in events if isinstance(e, GenerationStarted)][0]
    assert grown.world_size == 8 and grown.restore_step == 2
    by_rank = {r.rank: r for r in grown.restores}
    # Ranks 0-3 held their own copies; ranks 4-7 never existed in the shrunk world: another's copy.
    assert all(by_rank[r].source_rank is None for r in range(4))
    assert {by_rank[r].source_rank for r in range(4, 8)} <= {0, 1, 2, 3}
    assert all(by_rank[r].source_rank is not None for r in range(4, 8))
    assert "other ranks' copies" in grown.reason
    placed = {m.node_id for m in grown.members}
    assert placed == {"n1", "n2", "n3", "s9"}
    directive = directive_for(sim.state, sim.config.job, "s9", "")
    assert all(r.source_rank is not None for r in directive.restores)
