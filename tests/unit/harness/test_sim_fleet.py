"""The simulator's adapter to the real core: each bulk shortcut equals feeding the inputs one by one."""

from __future__ import annotations

import dataclasses

from ftsup.harness.sim.fleet import DIGEST, CoreDriver, build_fleet, registered_state
from ftsup.supervisor.core.config import DetectorConfig
from ftsup.supervisor.core.events import (
    GenerationEnded,
    GenerationStarted,
    NodeDeclaredDead,
    NodeQuarantined,
    NodeRegistered,
    NodeRole,
    NodeUnquarantined,
    RestoreKind,
    SnapshotCommitted,
)
from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.inputs import Heartbeat, SnapshotReport, StepReport

DETECTOR = DetectorConfig(heartbeat_interval_s=1.0, heartbeat_misses=2)


def _running(nodes: int = 4, spares: int = 2, ranks_per_node: int = 2) -> CoreDriver:
    fleet = build_fleet(nodes, spares, 8, ranks_per_node)
    driver = CoreDriver(fleet.job, DETECTOR, fleet.state)
    driver.start_running(0.0, 10.0)
    return driver


def test_the_registered_fleet_is_what_folding_its_registrations_gives():
    events = [NodeRegistered(f"n{i:05d}", 1, NodeRole.ACTIVE, "sim", 9000, 8) for i in range(3)]
    events += [NodeRegistered(f"s{i:05d}", 1, NodeRole.SPARE, "sim", 9000, 8) for i in range(2)]
    folded = evolve_all(registered_state(0, 0, 8), events)
    assert registered_state(3, 2, 8) == dataclasses.replace(folded, applied_seq=5)


def test_the_core_plans_the_first_generation_on_the_active_nodes():
    fleet = build_fleet(4, 2, 8, 2)
    generation = fleet.state.generation
    assert generation is not None and generation.number == 1
    assert [m.node_id for m in generation.members] == ["n00000", "n00001", "n00002", "n00003"]
    assert generation.world_size == 8


def test_bulk_heartbeats_equal_heartbeat_inputs_and_decide_nothing():
    bulk, fed = _running(), _running()
    bulk.heartbeats(5.0)
    for node_id, info in fed.soft.nodes.items():
        assert fed.feed(Heartbeat(node_id, info.incarnation, 1), 5.0) == ()
    assert {n: i.last_heard_s for n, i in bulk.soft.nodes.items()} == {n: i.last_heard_s for n, i in fed.soft.nodes.items()}
    assert bulk.state == fed.state


def test_a_bulk_snapshot_commit_equals_every_rank_reporting_its_step_and_its_copies():
    bulk, fed = _running(), _running()
    assert bulk.commit_snapshot(7, 70.0, 10.0) == (SnapshotCommitted(generation=1, step=7),)
    generation = fed.state.generation
    assert generation is not None
    events = []
    for member in generation.members:
        for rank in member.ranks:
            for holder in (member.node_id, member.buddy_node_id):
                events += fed.feed(SnapshotReport(holder, 1, rank, 7, (holder,), 1), 70.0)
    for member in generation.members:
        for rank in member.ranks:
            events += fed.feed(StepReport(member.node_id, 1, rank, 7, 10.0, 10.0, 1.0, DIGEST), 70.0)
    assert events == [SnapshotCommitted(generation=1, step=7)]
    assert bulk.state == fed.state


def test_a_silent_node_is_declared_dead_at_its_deadline_not_before_and_a_spare_takes_its_ranks():
    driver = _running()
    driver.commit_snapshot(3, 30.0, 10.0)
    deadline = driver.fail("n00002", 100.0)
    assert deadline >= 102.0
    assert not any(isinstance(e, NodeDeclaredDead) for e in driver.tick(deadline - 0.01))
    events = driver.tick(deadline)
    kinds = [type(e) for e in events]
    assert kinds[:3] == [NodeDeclaredDead, GenerationEnded, NodeQuarantined]
    started = events[-1]
    assert isinstance(started, GenerationStarted) and started.restore_step == 3
    replaced = next(m for m in started.members if m.ranks == (4, 5))
    assert replaced.node_id == "s00000"
    assert {r.kind for r in started.restores if r.rank in (4, 5)} == {RestoreKind.PEER_SNAPSHOT}


def test_a_repaired_node_returns_as_an_unquarantined_spare():
    driver = _running(spares=0)
    driver.tick(driver.fail("n00001", 50.0))
    assert driver.state.generation is None
    assert driver.waiting_reason.startswith("need 4 healthy nodes")
    events = driver.repair("n00001", 500.0)
    assert any(isinstance(e, NodeUnquarantined) for e in events)
    assert isinstance(events[-1], GenerationStarted)
    node = driver.state.nodes["n00001"]
    assert (node.role, node.incarnation, node.is_quarantined) == (NodeRole.SPARE, 2, False)


def _after_a_replacement() -> CoreDriver:
    driver = _running()
    driver.commit_snapshot(3, 30.0, 10.0)  # the bulk holdings of generation 1
    driver.tick(driver.fail("n00002", 100.0))
    driver.start_running(200.0, 10.0)
    return driver


def test_a_bulk_commit_in_a_later_generation_equals_every_rank_reporting_its_step_and_its_copies():
    # Generation 2 differs from 1 in two members (the replacement and its ring predecessor): the
    # bulk path patches its holdings from generation 1's rather than walking every member.
    bulk, fed = _after_a_replacement(), _after_a_replacement()
    generation = fed.state.generation
    assert generation is not None and generation.number == 2
    assert bulk.commit_snapshot(9, 290.0, 10.0) == (SnapshotCommitted(generation=2, step=9),)
    events = []
    for member in generation.members:
        for rank in member.ranks:
            for holder in (member.node_id, member.buddy_node_id):
                events += fed.feed(SnapshotReport(holder, 2, rank, 9, (holder,), 1), 290.0)
    for member in generation.members:
        for rank in member.ranks:
            events += fed.feed(StepReport(member.node_id, 2, rank, 9, 10.0, 10.0, 1.0, DIGEST), 290.0)
    assert events == [SnapshotCommitted(generation=2, step=9)]
    assert bulk.state == fed.state
