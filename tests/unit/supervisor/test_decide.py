"""The supervisor's decisions, driven through the pure core with plain data and a fixed clock."""

from __future__ import annotations

import math

import pytest

from ftsup.supervisor.core.events import (
    EndReason,
    GenerationEnded,
    GenerationRunning,
    GenerationStarted,
    JobCompleted,
    NodeCleared,
    NodeDeclaredDead,
    NodeQuarantined,
    NodeRegistered,
    NodeSuspected,
    RestoreKind,
    SnapshotCommitted,
)
from ftsup.supervisor.core.inputs import (
    Heartbeat,
    RankFinished,
    SnapshotReport,
    StepReport,
    StreamClosed,
    Tick,
    TrainerExit,
)
from ftsup.supervisor.core.state import Liveness
from tests.support.builders import NOW, Sim, config, hello


def running_cluster(spares: int = 1) -> Sim:
    sim = Sim()
    for i in (1, 2, 3):
        sim.events(hello(f"n{i}", stream_id=i))
    for j in range(spares):
        sim.events(hello(f"s{j + 1}", spare=True, stream_id=10 + j))
    return sim


def alive(sim: Sim, at: float, *, silent: tuple[str, ...] = ()) -> None:
    """Heartbeats from every node still connected, except `silent` ones."""
    for node_id, info in sim.soft.nodes.items():
        if info.stream_id is not None and node_id not in silent:
            sim.events(Heartbeat(node_id, info.incarnation, 0), at=at)


def step(sim: Sim, generation: int, step_no: int, *, at: float | None = None) -> None:
    """Every rank reports the step and its snapshot held by its node and its buddy."""
    current = sim.state.generation
    assert current is not None
    for member in current.members:
        for rank in member.ranks:
            sim.events(StepReport(member.node_id, generation, rank, step_no, 0.1, 0.08, 2.0, "d"), at=at)
            for holder in (member.node_id, member.buddy_node_id):
                sim.events(SnapshotReport(holder, generation, rank, step_no, (holder,), 100), at=at)


def test_a_gang_starts_only_when_every_rank_can_be_placed():
    sim = Sim()
    assert [type(e) for e in sim.events(hello("n1", stream_id=1))] == [NodeRegistered]
    assert "waiting for 3 active nodes (1 registered)" in sim.waiting_reason
    sim.events(hello("n2", stream_id=2))
    events = sim.events(hello("n3", stream_id=3))
    started = events[-1]
    assert isinstance(started, GenerationStarted)
    assert started.generation == 1 and started.world_size == 6 and started.restore_step is None
    assert [(m.node_id, m.ranks, m.buddy_node_id) for m in started.members] == [
        ("n1", (0, 1), "n2"), ("n2", (2, 3), "n3"), ("n3", (4, 5), "n1"),
    ]
    assert all(r.kind is RestoreKind.FRESH for r in started.restores)


def test_spares_are_used_only_when_active_nodes_are_missing():
    sim = Sim()
    sim.events(hello("s1", spare=True, stream_id=9))
    sim.events(hello("n1", stream_id=1))
    sim.events(hello("n2", stream_id=2))
    sim.events(hello("n3", stream_id=3))
    # The spare registered first, but three active nodes now exist: they form the gang.
    assert sim.state.generation is not None
    assert {m.node_id for m in sim.state.generation.members} == {"n1", "n2", "n3"}


def test_first_step_marks_the_generation_running_once():
    sim = running_cluster()
    first = sim.events(StepReport("n1", 1, 0, 1, 0.2, 0.1, 3.0, "d"))
    assert first == [GenerationRunning(1, 1)]
    assert sim.events(StepReport("n2", 1, 2, 1, 0.2, 0.1, 3.0, "d")) == []


def test_a_snapshot_commits_only_when_every_rank_is_held_by_its_node_and_its_buddy():
    sim = running_cluster()
    for rank in range(6):  # every rank's digest of step 1 agreed (without that, no commit: test_sdc)
        sim.events(StepReport(f"n{rank // 2 + 1}", 1, rank, 1, 0.2, 0.1, 3.0, "d"))
    holders = [("n1", 0), ("n2", 0), ("n1", 1), ("n2", 1), ("n2", 2), ("n3", 2), ("n2", 3), ("n3", 3), ("n3", 4),
               ("n1", 4)]
    for node, rank in holders:
        assert sim.events(SnapshotReport(node, 1, rank, 1, (node,), 10)) == []
    # Rank 5 held only by its own node (the buddy's copy has not landed): not restorable yet.
    assert sim.events(SnapshotReport("n3", 1, 5, 1, ("n3",), 10)) == []
    # A node's claim about another node's copy counts for nothing.
    assert sim.events(SnapshotReport("n3", 1, 5, 1, ("n3", "n1"), 10)) == []
    assert sim.events(SnapshotReport("n1", 1, 5, 1, ("n1",), 10)) == [SnapshotCommitted(1, 1)]
    assert sim.state.snapshot is not None and sim.state.snapshot.step == 1


def test_only_a_ranks_node_or_its_buddy_may_report_holding_it():
    sim = running_cluster()
    reason = sim.feed(SnapshotReport("n2", 1, 5, 1, ("n2",), 10))
    assert isinstance(reason, str) and "neither the owner nor the buddy of rank 5" in reason


def test_a_killed_node_is_suspected_at_once_declared_dead_after_the_grace_and_replaced_by_the_spare():
    sim = running_cluster()
    step(sim, 1, 1)
    step(sim, 1, 2)
    alive(sim, NOW + 5.0)
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 5.0)
    assert sim.events(Tick(), at=NOW + 5.1) == [NodeSuspected("n3", "stream closed", pytest.approx(0.1))]
    assert sim.events(Tick(), at=NOW + 5.5) == []
    alive(sim, NOW + 6.0)
    events = sim.events(Tick(), at=NOW + 6.1)
    kinds = [type(e) for e in events]
    assert kinds == [NodeDeclaredDead, GenerationEnded, NodeQuarantined, GenerationStarted]
    ended, quarantined, started = events[1], events[2], events[3]
    assert ended.reason is EndReason.NODE_LOST and ended.node_id == "n3" and ended.last_step == 2
    assert quarantined.evidence_seq == sim.state.applied_seq - 3  # the death record
    assert started.generation == 2 and started.restore_step == 2
    assert [(m.node_id, m.ranks) for m in started.members] == [("n1", (0, 1)), ("n2", (2, 3)), ("s1", (4, 5))]
    kinds_by_rank = {r.rank: (r.kind, r.source_node_id) for r in started.restores}
    # The lost node's ranks come from their buddy's RAM; everyone else restores locally.
    assert kinds_by_rank[4] == (RestoreKind.PEER_SNAPSHOT, "n1")
    assert kinds_by_rank[5] == (RestoreKind.PEER_SNAPSHOT, "n1")
    assert all(kinds_by_rank[r] == (RestoreKind.LOCAL_SNAPSHOT, n) for r, n in
               [(0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")])
    node = sim.state.node("n3")
    assert node is not None and node.liveness is Liveness.DEAD and node.is_quarantined


def test_a_silent_node_with_an_open_stream_dies_after_the_missed_heartbeats():
    sim = running_cluster()
    for t in (1.0, 2.0):
        for n in ("n1", "n2", "s1"):
            sim.events(Heartbeat(n, 1, 1), at=NOW + t)
    assert [type(e) for e in sim.events(Tick(), at=NOW + 2.1)] == [NodeSuspected]
    for n in ("n1", "n2", "s1"):
        sim.events(Heartbeat(n, 1, 1), at=NOW + 3.0)
    events = sim.events(Tick(), at=NOW + 3.05)
    assert isinstance(events[0], NodeDeclaredDead) and events[0].node_id == "n3"
    assert "no heartbeat" in events[0].reason


def test_a_suspect_that_reconnects_within_the_grace_is_cleared_and_nothing_restarts():
    sim = running_cluster()
    sim.events(StreamClosed("n2", 1, 2), at=NOW + 1.0)
    assert [type(e) for e in sim.events(Tick(), at=NOW + 1.1)] == [NodeSuspected]
    assert sim.events(hello("n2", stream_id=22), at=NOW + 1.5) == [NodeCleared("n2", "reconnected")]
    alive(sim, NOW + 2.5)
    assert sim.events(Tick(), at=NOW + 3.0) == []
    assert sim.state.generation is not None and sim.state.generation.number == 1


def test_a_fresh_supervisor_gives_every_node_a_full_timeout_of_grace():
    sim = running_cluster()
    # Restarted supervisor: same state, empty soft state, nobody has spoken yet.
    fresh = Sim(sim.config, now=NOW + 100, state=sim.state)
    assert fresh.events(Tick(), at=NOW + 102.9) == []
    verdicts = fresh.events(Tick(), at=NOW + 103.1)
    assert {e.node_id for e in verdicts if isinstance(e, NodeDeclaredDead)} == {"n1", "n2", "n3", "s1"}


def test_a_trainer_crash_on_a_healthy_node_restarts_the_same_gang_from_local_ram():
    sim = running_cluster()
    step(sim, 1, 1)
    step(sim, 1, 2)
    events = sim.events(TrainerExit("n2", 1, 3, -11, False))
    ended, started = events
    assert ended == GenerationEnded(1, EndReason.TRAINER_EXITED, "n2", 2, "rank 3 exited with signal 11",
                                     rank=3, exit_code=-11)
    assert isinstance(started, GenerationStarted) and started.restore_step == 2
    assert {m.node_id for m in started.members} == {"n1", "n2", "n3"}
    assert all(r.kind is RestoreKind.LOCAL_SNAPSHOT for r in started.restores)
    # Reports from the crashed generation are now stale.
    assert "stale generation 1" in sim.feed(StepReport("n1", 1, 0, 3, 0.1, 0.1, 1.0, "d"))


def test_a_survivors_exit_while_a_member_is_suspect_waits_for_the_verdict_which_names_the_cause():
    sim = running_cluster()
    step(sim, 1, 1)
    alive(sim, NOW + 11.0)
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 11.0)
    sim.events(Tick(), at=NOW + 11.05)
    # Survivors' ranks fail as their peer vanished: held, not blamed on n1.
    assert sim.events(TrainerExit("n1", 1, 0, 1, False), at=NOW + 11.1) == []
    alive(sim, NOW + 12.0)
    events = sim.events(Tick(), at=NOW + 12.1)
    assert [type(e) for e in events] == [NodeDeclaredDead, GenerationEnded, NodeQuarantined, GenerationStarted]
    ended = events[1]
    assert isinstance(ended, GenerationEnded) and ended.reason is EndReason.NODE_LOST and ended.node_id == "n3"


def test_the_job_completes_when_every_rank_finished():
    sim = running_cluster()
    step(sim, 1, 1)
    for rank in range(5):
        node = sim.state.generation.node_of_rank(rank)
        assert sim.events(RankFinished(node, 1, rank, 1, "abc")) == []
    events = sim.events(RankFinished("n3", 1, 5, 1, "abc"))
    assert [type(e) for e in events] == [GenerationEnded, JobCompleted]
    assert events[1] == JobCompleted(1, 1, "abc")
    assert sim.state.completion is not None
    # Exits after finishing are expected and change nothing.
    assert sim.events(TrainerExit("n1", 1, 0, 0, True)) == []


def test_no_ram_copy_left_means_a_fresh_start_not_a_crash():
    sim = running_cluster(spares=2)
    step(sim, 1, 1)
    # n1 holds rank 4-5's buddy copies; lose n3 and n1 together.
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 11.0)
    sim.events(StreamClosed("n1", 1, 1), at=NOW + 11.0)
    alive(sim, NOW + 12.4)
    events = sim.events(Tick(), at=NOW + 12.5)
    started = events[-1]
    assert isinstance(started, GenerationStarted) and started.restore_step is None
    assert all(r.kind is RestoreKind.FRESH for r in started.restores)


@pytest.mark.parametrize(
    ("report", "why"),
    [
        (StepReport("n1", 1, 0, 1, math.nan, 0.1, 1.0, "d"), "step_time_s=nan"),
        (StepReport("n1", 1, 0, 1, math.inf, 0.1, 1.0, "d"), "step_time_s=inf"),
        (StepReport("n1", 1, 0, 1, -1.0, 0.1, 1.0, "d"), "step_time_s=-1.0"),
        (StepReport("n1", 1, 0, 1, 0.1, 5.0, 1.0, "d"), "exceeds step_time_s"),
        (StepReport("n1", 7, 0, 1, 0.1, 0.1, 1.0, "d"), "stale generation 7"),
        (StepReport("n1", 1, 4, 1, 0.1, 0.1, 1.0, "d"), "does not hold rank 4"),
        (StepReport("ghost", 1, 0, 1, 0.1, 0.1, 1.0, "d"), "has not said Hello"),
    ],
)
def test_bad_step_reports_are_refused_with_a_reason_and_change_nothing(report, why):
    sim = running_cluster()
    before = sim.state
    reason = sim.feed(report)
    assert isinstance(reason, str) and why in reason
    assert sim.state == before


def test_a_duplicate_node_id_is_refused_while_the_first_is_connected():
    sim = running_cluster()
    reason = sim.feed(hello("n1", incarnation=2, stream_id=99))
    assert isinstance(reason, str) and "duplicate node id 'n1'" in reason
    # Once the first agent's stream is gone, a restarted agent may take the id.
    sim.events(StreamClosed("n1", 1, 1))
    events = sim.events(hello("n1", incarnation=2, stream_id=99))
    assert [type(e) for e in events][:2] == [GenerationEnded, NodeRegistered]
    assert events[0].reason is EndReason.NODE_RESTARTED


def test_unknown_and_malformed_node_ids_are_refused():
    sim = Sim(config(allowed=frozenset({"n1"})))
    assert "unknown node id 'n9'" in sim.feed(hello("n9"))
    assert "is not canonical" in sim.feed(hello("bad id/with slash"))
    assert "not a valid port" in sim.feed(hello("n1", port=0))


def test_after_the_start_grace_a_spare_stands_in_for_an_active_node_that_never_came():
    sim = Sim()
    sim.events(hello("n1", stream_id=1))
    sim.events(hello("n2", stream_id=2))
    sim.events(hello("s1", spare=True, stream_id=9))
    assert sim.state.generation is None
    alive(sim, NOW + 2.9)
    assert sim.state.generation is None
    sim.events(Tick(), at=NOW + 3.05)
    assert sim.state.generation is not None
    assert {m.node_id for m in sim.state.generation.members} == {"n1", "n2", "s1"}


def test_an_xid_79_quarantines_the_node_and_a_spare_takes_its_ranks():
    from ftsup.supervisor.core.events import XidAction, XidReported
    from ftsup.supervisor.core.inputs import XidReport

    sim = running_cluster()
    step(sim, 1, 1)
    alive(sim, NOW + 5.0)
    events = sim.events(XidReport("n2", "0000:3b:00", 3, 79, "GPU has fallen off the bus."), at=NOW + 5.0)
    kinds = [type(e) for e in events]
    assert kinds == [XidReported, GenerationEnded, NodeQuarantined, GenerationStarted]
    assert events[0].action is XidAction.QUARANTINE_NODE and events[0].gpu == 3
    assert events[1].reason is EndReason.NODE_QUARANTINED and events[1].node_id == "n2"
    assert events[2].evidence_seq == sim.state.applied_seq - 3 and "Xid 79" in events[2].reason
    started = events[3]
    assert [m.node_id for m in started.members] == ["n1", "s1", "n3"]
    by_rank = {r.rank: r for r in started.restores}
    # The quarantined node is alive: its RAM still serves, but the spare fetches from the buddy.
    assert by_rank[2].kind is RestoreKind.PEER_SNAPSHOT


def test_an_ignorable_xid_is_only_recorded_and_a_restart_xid_restarts_the_same_gang():
    from ftsup.supervisor.core.events import XidReported
    from ftsup.supervisor.core.inputs import XidReport

    sim = running_cluster()
    step(sim, 1, 1)
    alive(sim, NOW + 5.0)
    assert [type(e) for e in sim.events(XidReport("n1", "0000:3b:00", None, 43, "Ch 0008"), at=NOW + 5)] == [XidReported]
    events = sim.events(XidReport("n1", "0000:3b:00", None, 13, "Graphics Exception"), at=NOW + 5.1)
    assert [type(e) for e in events] == [XidReported, GenerationEnded, GenerationStarted]
    assert events[1].reason is EndReason.XID
    assert {m.node_id for m in events[2].members} == {"n1", "n2", "n3"}
    assert sim.state.nodes["n1"].xid_count == 2


def test_repeated_xids_on_one_gpu_escalate_to_quarantine():
    from ftsup.supervisor.core.events import XidAction, XidReported
    from ftsup.supervisor.core.inputs import XidReport

    sim = running_cluster()
    alive(sim, NOW + 5.0)
    actions = []
    for i in range(3):
        events = sim.events(XidReport("n1", "0000:3b:00", 0, 31, "MMU Fault"), at=NOW + 5 + i)
        actions.append(next(e for e in events if isinstance(e, XidReported)).action)
        alive(sim, NOW + 5.5 + i)
    assert actions[:2] == [XidAction.RESTART_JOB, XidAction.RESTART_JOB]
    assert actions[2] is XidAction.QUARANTINE_NODE and sim.state.nodes["n1"].is_quarantined


def test_operator_quarantine_unquarantine_and_a_drain_at_the_next_committed_step():
    from ftsup.supervisor.core.events import NodeUnquarantined, OperatorCommand
    from ftsup.supervisor.core.inputs import OperatorRequest

    sim = running_cluster(spares=2)
    step(sim, 1, 1)
    alive(sim, NOW + 5.0)
    events = sim.events(OperatorRequest("quarantine", "n3", "flaky NIC", "alice"), at=NOW + 5.0)
    assert [type(e) for e in events] == [OperatorCommand, GenerationEnded, NodeQuarantined, GenerationStarted]
    assert events[2].reason == "quarantine by alice: flaky NIC"
    assert "already quarantined" in sim.feed(OperatorRequest("quarantine", "n3", "again", "alice"))
    assert "unknown node 'n9'" in sim.feed(OperatorRequest("drain", "n9", "x", "alice"))
    assert "reason is required" in sim.feed(OperatorRequest("drain", "n1", " ", "alice"))
    # Drain a training node: nothing moves until the next committed step.
    assert [type(e) for e in sim.events(OperatorRequest("drain", "n1", "kernel upgrade", "bob"))] == [OperatorCommand]
    gen = sim.state.generation.number
    step(sim, gen, 2)
    ended = [e for e in sim.log if isinstance(e, GenerationEnded)][-1]
    assert ended.reason is EndReason.NODE_DRAINED and ended.node_id == "n1"
    assert sim.state.nodes["n1"].is_drained
    assert "n1" not in {m.node_id for m in sim.state.generation.members}
    events = sim.events(OperatorRequest("unquarantine", "n3", "NIC replaced", "alice"))
    assert [type(e) for e in events][:2] == [OperatorCommand, NodeUnquarantined]
    assert sim.state.nodes["n3"].is_in_service


def test_an_idle_node_is_drained_at_once():
    from ftsup.supervisor.core.events import NodeDrained, OperatorCommand
    from ftsup.supervisor.core.inputs import OperatorRequest

    sim = running_cluster()
    events = sim.events(OperatorRequest("drain", "s1", "maintenance", "bob"))
    assert [type(e) for e in events] == [OperatorCommand, NodeDrained]


def test_a_hung_rank_behind_the_others_is_treated_as_lost_its_node_swapped_for_a_spare():
    from ftsup.supervisor.core.inputs import TrainerHung

    sim = running_cluster()
    step(sim, 1, 3)
    for member in sim.state.generation.members:  # every rank but 2 completed step 4
        for rank in member.ranks:
            if rank != 2:
                sim.events(StepReport(member.node_id, 1, rank, 4, 0.1, 0.08, 2.0, "d"), at=NOW + 4.0)
    alive(sim, NOW + 5.0)
    events = sim.events(TrainerHung("n2", 1, 2, 3, 120.0, 60.0), at=NOW + 5.0)
    assert [type(e) for e in events] == [GenerationEnded, NodeQuarantined, GenerationStarted]
    assert events[0].reason is EndReason.HUNG and "no step progress for 120s" in events[0].detail
    assert events[2].restore_step == 3 and "n2" not in {m.node_id for m in events[2].members}
    assert {r.rank: r.kind for r in events[2].restores}[2] is RestoreKind.PEER_SNAPSHOT


def test_a_hang_where_every_rank_stopped_at_the_same_step_blames_nobody_and_restarts_the_gang():
    # One frozen rank stalls all others in the next collective: the reporting node is not the
    # culprit (chaos hung_trainer: a healthy node was swapped out). Nobody is quarantined.
    from ftsup.supervisor.core.inputs import TrainerHung

    sim = running_cluster()
    step(sim, 1, 3)
    alive(sim, NOW + 5.0)
    events = sim.events(TrainerHung("n3", 1, 4, 3, 120.0, 60.0), at=NOW + 5.0)
    assert [type(e) for e in events] == [GenerationEnded, GenerationStarted]
    assert "culprit is unknown" in events[0].detail
    assert {m.node_id for m in events[1].members} == {"n1", "n2", "n3"} and events[1].restore_step == 3


def test_without_a_spare_a_hang_restarts_the_same_gang():
    from ftsup.supervisor.core.inputs import TrainerHung

    sim = running_cluster(spares=0)
    step(sim, 1, 3)
    alive(sim, NOW + 5.0)
    events = sim.events(TrainerHung("n2", 1, 2, 3, 120.0, 60.0), at=NOW + 5.0)
    assert [type(e) for e in events] == [GenerationEnded, GenerationStarted]
    assert {m.node_id for m in events[1].members} == {"n1", "n2", "n3"}


def test_a_node_whose_stream_loss_was_transient_returns_to_service_when_the_same_agent_reconnects():
    from ftsup.supervisor.core.events import NodeUnquarantined

    sim = running_cluster()
    step(sim, 1, 1)
    alive(sim, NOW + 5.0)
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 5.0)
    alive(sim, NOW + 6.0)
    sim.events(Tick(), at=NOW + 6.1)
    assert sim.state.nodes["n3"].is_quarantined  # declared dead: replaced by the spare
    events = sim.events(hello("n3", incarnation=1, stream_id=33), at=NOW + 7.0)
    assert [type(e) for e in events] == [NodeRegistered, NodeUnquarantined]
    assert sim.state.nodes["n3"].is_in_service
    # A different process under the same name (a restarted agent) stays quarantined.
    sim.events(StreamClosed("s1", 1, 10), at=NOW + 8.0)
    alive(sim, NOW + 9.0)
    sim.events(Tick(), at=NOW + 9.1)
    events = sim.events(hello("s1", spare=True, incarnation=2, stream_id=44), at=NOW + 10.0)
    assert [type(e) for e in events][:1] == [NodeRegistered] and sim.state.nodes["s1"].is_quarantined


def _slow_steps(sim: Sim, first: int, last: int, slow_rank: int, *, at: float) -> list:
    """Every rank reports steps first..last; `slow_rank` computes 40 % slower than the others."""
    emitted = []
    for step_no in range(first, last + 1):
        current = sim.state.generation
        for member in current.members:
            for rank in member.ranks:
                compute = 0.14 if rank == slow_rank else 0.1 + 0.001 * (rank % 3)
                result = sim.feed(StepReport(member.node_id, current.number, rank, step_no, 0.2, compute, 2.0, "d"),
                                  at=at)
                assert not isinstance(result, str), result
                emitted += result
    return emitted


def test_a_persistent_straggler_is_recorded_and_swapped_for_a_free_spare():
    from ftsup.supervisor.core.events import StragglerDetected

    sim = running_cluster()
    alive(sim, NOW + 5.0)
    emitted = _slow_steps(sim, 1, 20, slow_rank=3, at=NOW + 5.0)
    detected = [e for e in emitted if isinstance(e, StragglerDetected)]
    assert len(detected) == 1 and detected[0].node_id == "n2" and detected[0].rank == 3
    assert detected[0].score >= 3.0 and detected[0].slow_steps >= 11
    quarantined = [e for e in emitted if isinstance(e, NodeQuarantined)]
    assert [q.node_id for q in quarantined] == ["n2"] and quarantined[0].reason.startswith("rank 3 straggler: ")
    assert {m.node_id for m in sim.state.generation.members} == {"n1", "s1", "n3"}


def test_without_a_free_spare_a_straggler_is_only_reported():
    from ftsup.supervisor.core.events import StragglerDetected

    sim = running_cluster(spares=0)
    alive(sim, NOW + 5.0)
    emitted = _slow_steps(sim, 1, 20, slow_rank=0, at=NOW + 5.0)
    assert [type(e) for e in emitted if not isinstance(e, GenerationRunning)] == [StragglerDetected]
    assert sim.state.generation.number == 1 and sim.state.nodes["n1"].straggler_score >= 3.0


def test_noise_and_a_whole_cohort_stall_flag_nobody():
    sim = running_cluster()
    alive(sim, NOW + 5.0)
    emitted = []
    for step_no in range(1, 40):
        stall = 3.0 if step_no % 10 == 0 else 1.0  # a data-loader stall slows every rank alike
        for member in sim.state.generation.members:
            for rank in member.ranks:
                jitter = 1.0 + 0.02 * ((rank * 7 + step_no * 3) % 5 - 2) / 2
                compute = 0.1 * stall * jitter
                emitted += sim.events(StepReport(member.node_id, 1, rank, step_no, 0.5, compute, 2.0, "d"), at=NOW + 5)
    assert [type(e) for e in emitted] == [GenerationRunning]


def test_a_spare_from_another_failure_domain_and_up_longest_replaces_a_lost_node():
    import dataclasses

    sim = Sim()
    for node, domain in (("n1", "rack-a"), ("n2", "rack-b"), ("n3", "rack-c")):
        sim.events(dataclasses.replace(hello(node, stream_id=hash(node) % 100), failure_domain=domain))
    # Spares: s-old registered first but shares rack-b with n2; s-far is elsewhere.
    sim.events(dataclasses.replace(hello("s-same", spare=True, stream_id=50), failure_domain="rack-b"))
    sim.events(dataclasses.replace(hello("s-far1", spare=True, stream_id=51), failure_domain="rack-d"))
    sim.events(dataclasses.replace(hello("s-far2", spare=True, stream_id=52), failure_domain="rack-e"))
    step(sim, 1, 1)
    alive(sim, NOW + 5.0)
    sim.events(StreamClosed("n2", 1, hash("n2") % 100), at=NOW + 5.0)
    alive(sim, NOW + 6.0)
    sim.events(Tick(), at=NOW + 6.1)
    assert [m.node_id for m in sim.state.generation.members] == ["n1", "s-far1", "n3"]
    assert sim.state.nodes["s-far1"].registered_order < sim.state.nodes["s-far2"].registered_order


def test_the_first_layout_does_not_depend_on_the_order_active_nodes_registered_in():
    sim = Sim()
    for node in ("n3", "n1", "n2"):
        sim.events(hello(node, stream_id=hash(node) % 100))
    assert [m.node_id for m in sim.state.generation.members] == ["n1", "n2", "n3"]


def test_a_node_a_new_leader_never_heard_in_time_returns_to_service_when_the_same_agent_reconnects():
    from ftsup.supervisor.core.events import NodeUnquarantined

    sim = running_cluster()
    step(sim, 1, 1)
    sim.restart_leader(started_at_s=NOW + 10.0)  # a new leader: soft state rebuilt from scratch
    for node_id, stream in (("n1", 51), ("n2", 52), ("s1", 53)):  # n3 is still finding the leader
        sim.events(hello(node_id, spare=node_id == "s1", stream_id=stream), at=NOW + 10.5)
    alive(sim, NOW + 12.0)
    dead = sim.events(Tick(), at=NOW + 13.1)  # one heartbeat timeout (3 s) of grace is over
    assert [e.node_id for e in dead if isinstance(e, NodeDeclaredDead)] == ["n3"]
    assert sim.state.nodes["n3"].is_quarantined
    events = sim.events(hello("n3", incarnation=1, stream_id=54), at=NOW + 14.0)
    assert [type(e) for e in events] == [NodeRegistered, NodeUnquarantined]
    assert sim.state.nodes["n3"].is_in_service


def test_the_supervisors_own_stall_is_not_counted_as_node_silence():
    sim = running_cluster()
    step(sim, 1, 1)
    alive(sim, NOW + 5.0)
    # The supervisor did not run for 4 s (heartbeats could not be read): nobody is judged for it.
    events = sim.events(Tick(stalled_s=4.0), at=NOW + 9.1)
    assert not [e for e in events if isinstance(e, (NodeDeclaredDead, NodeSuspected))]
    # Silence after the stall still counts: 3 s more without heartbeats is a death (3 s timeout).
    events = sim.events(Tick(), at=NOW + 12.2)
    assert {e.node_id for e in events if isinstance(e, NodeDeclaredDead)} == {"n1", "n2", "n3", "s1"}
