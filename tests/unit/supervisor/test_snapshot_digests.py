"""Issue 16 on the supervisor: a step commits only when owner and buddy hold the same bytes, absurd
holdings are ignored, and every directive carries the peer grants its agent authorizes against."""

from __future__ import annotations

import pytest

from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core.directives import PeerGrant, directive_for, directives_for
from ftsup.supervisor.core.events import SnapshotCommitted
from ftsup.supervisor.core.inputs import Heartbeat, SnapshotReport, StepReport, StreamClosed, Tick
from tests.support.builders import NOW, Sim, hello

SHA = "a" * 64
OTHER = "b" * 64


def running_cluster() -> Sim:
    sim = Sim()
    for i in (1, 2, 3):
        sim.events(hello(f"n{i}", stream_id=i))
    sim.events(hello("s1", spare=True, stream_id=10))
    return sim


def report_step(sim: Sim, step: int, *, buddy_sha: dict[int, str] | None = None) -> list:
    """Every rank reports `step`, its node and its buddy the holding (the buddy's digest per rank
    from `buddy_sha`, else the owner's); returns the events of the last report."""
    generation = sim.state.generation
    assert generation is not None
    events: list = []
    for member in generation.members:
        for rank in member.ranks:
            sim.events(StepReport(member.node_id, generation.number, rank, step, 0.1, 0.08, 2.0, "d"))
    for member in generation.members:
        for rank in member.ranks:
            sim.events(SnapshotReport(member.node_id, generation.number, rank, step, (member.node_id,), 10, SHA))
            sha = (buddy_sha or {}).get(rank, SHA)
            events = sim.events(SnapshotReport(member.buddy_node_id, generation.number, rank, step,
                                               (member.buddy_node_id,), 10, sha))
    return events


def test_a_step_commits_when_owner_and_buddy_report_the_same_digest():
    sim = running_cluster()
    assert report_step(sim, 1) == [SnapshotCommitted(1, 1)]


def test_a_step_whose_buddy_holds_other_bytes_never_commits_and_the_next_good_step_does():
    sim = running_cluster()
    assert report_step(sim, 1, buddy_sha={3: OTHER}) == []
    assert sim.state.snapshot is None  # every rank is held twice, but rank 3's copies differ
    assert 1 in sim.soft.progress.holding_mismatches
    assert report_step(sim, 2) == [SnapshotCommitted(1, 2)]
    assert sim.soft.progress.holding_mismatches == set()  # forgotten with the commit


def test_a_holding_far_beyond_the_generations_progress_is_ignored():
    sim = running_cluster()
    report_step(sim, 1)
    absurd = 2**40  # admissible as a number (admission refuses > 2^53), absurd as progress
    sim.events(SnapshotReport("n2", 1, 0, absurd, ("n2",), 10, SHA))
    sim.events(SnapshotReport("n2", 1, 0, 1 + soft_state.MAX_HOLDING_LEAD, ("n2",), 10, SHA))
    assert absurd not in sim.soft.progress.holdings
    assert 1 + soft_state.MAX_HOLDING_LEAD in sim.soft.progress.holdings


def test_a_node_naming_many_future_steps_costs_a_bounded_number_of_steps_and_the_real_one_commits():
    # Each step's holdings are arrays over every rank, made at its first entry: a confused node
    # naming one rank of each of many future steps must not make the leader keep them all, nor
    # push out the step the fleet is about to commit (the one nearest its newest report).
    sim = running_cluster()
    report_step(sim, 1)
    bound = soft_state.MAX_HOLDING_STEPS
    for step in range(3, 3 + 2 * bound):
        sim.events(SnapshotReport("n2", 1, 0, step, ("n2",), 10, SHA))
    progress = sim.soft.progress
    assert progress is not None and len(progress.holdings) == bound
    assert max(progress.holdings) < 3 + 2 * bound - 1, "the farthest ahead are not kept"
    assert report_step(sim, 2) == [SnapshotCommitted(1, 2)], "the fleet's next step still commits"
    for step in range(3, 3 + bound):  # and after it, the farthest from the newest report go first
        sim.events(SnapshotReport("n2", 1, 0, step, ("n2",), 10, SHA))
    assert len(progress.holdings) <= bound


def test_each_node_is_granted_its_owners_stores_and_its_restorers_fetches():
    sim = running_cluster()
    grants = {n: directive_for(sim.state, sim.config.job, n, "").peer_grants for n in ("n1", "n2", "n3", "s1")}
    # n1's buddy is n2, n2's is n3, n3's is n1: each node stores the ranks of the node it backs up.
    assert grants == {"n1": (PeerGrant("n3", (4, 5), ()),), "n2": (PeerGrant("n1", (0, 1), ()),),
                      "n3": (PeerGrant("n2", (2, 3), ()),), "s1": ()}
    report_step(sim, 1)
    for t in (5.0, 6.0):
        for node in ("n1", "n2", "s1"):
            sim.events(Heartbeat(node, 1, 0), at=NOW + t)
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 5.0)
    sim.events(Tick(), at=NOW + 5.1)
    sim.events(Tick(), at=NOW + 6.1)
    generation = sim.state.generation
    assert generation is not None and generation.number == 2
    # The spare takes n3's ranks 4 and 5, restores them from n1 (their buddy copy's holder) and,
    # in n3's place, has n1 as its buddy.
    n1 = directive_for(sim.state, sim.config.job, "n1", "").peer_grants
    assert {g.node_id: g for g in n1}["s1"] == PeerGrant("s1", (4, 5), (4, 5))
    many = {d.generation: d for d in directives_for(sim.state, sim.config.job, ["n1"] * 8, "")}
    assert many[2].peer_grants == n1  # one pass over the generation gives the same grants


@pytest.mark.parametrize("sha", ["", SHA])
def test_reports_without_a_digest_from_both_holders_still_agree(sha):
    sim = Sim()
    for i in (1, 2, 3):
        sim.events(hello(f"n{i}", stream_id=i))
    generation = sim.state.generation
    assert generation is not None
    for member in generation.members:
        for rank in member.ranks:
            sim.events(StepReport(member.node_id, 1, rank, 1, 0.1, 0.08, 2.0, "d"))
    events: list = []
    for member in generation.members:
        for rank in member.ranks:
            for holder in (member.node_id, member.buddy_node_id):
                events = sim.events(SnapshotReport(holder, 1, rank, 1, (holder,), 10, sha))
    assert events == [SnapshotCommitted(1, 1)]
