"""A soak failure's victim, cause and recovery, read from hand-built logs (harness/chaos/attribution.py).

Each log reproduces a race the old wall-clock rules lost: `wall_clock_recovery` below is the rule
the soak used before (the first GenerationRunning after the fault's time of a generation above
the one GetStatus reported, or the first step committed after it), and `last_started_members`
its victim list (the newest GenerationStarted's members, alive or not). The tests show the old
answer is wrong on the log and the new one is right.
"""

from __future__ import annotations

from ftsup.harness.chaos import attribution
from ftsup.harness.chaos.attribution import Steady
from ftsup.harness.chaos.checks import after, kind, of_kind
from ftsup.v1 import events_pb2 as ev

LIVE = {"node-1", "node-2", "node-3", "spare-5", "spare-6"}


def rec(seq: int, t: float, term: int = 1, **event: object) -> ev.Record:
    return ev.Record(seq=seq, time_unix_s=t, term=term, event=ev.Event(**event))


def started(seq: int, t: float, generation: int, nodes: list[str], restore: int | None = None) -> ev.Record:
    members = [ev.RankAssignment(node_id=n, ranks=[i]) for i, n in enumerate(nodes)]
    body = ev.GenerationStarted(generation=generation, members=members, world_size=len(nodes))
    if restore is not None:
        body.restore_step = restore
    return rec(seq, t, generation_started=body)


def running(seq: int, t: float, generation: int) -> ev.Record:
    return rec(seq, t, generation_running=ev.GenerationRunning(generation=generation))


def ended(seq: int, t: float, generation: int, reason: int, node: str, last: int) -> ev.Record:
    return rec(seq, t, generation_ended=ev.GenerationEnded(generation=generation, reason=reason, node_id=node,
                                                           last_step=last))


def committed(seq: int, t: float, generation: int, step: int, term: int = 1) -> ev.Record:
    return rec(seq, t, term, snapshot_committed=ev.SnapshotCommitted(generation=generation, step=step))


def wall_clock_recovery(records: list[ev.Record], at: float, status_generation: int, restarts: bool,
                        step: int) -> int | None:
    """The seq the soak's old rule took for the recovery, kept here to show each log defeats it."""
    for r in after(records, at):
        if restarts and kind(r) == "generation_running" and r.event.generation_running.generation > status_generation:
            return r.seq
        if not restarts and kind(r) == "snapshot_committed" and r.event.snapshot_committed.step > step:
            return r.seq
    return None


def last_started_members(records: list[ev.Record]) -> list[str]:
    return [m.node_id for m in of_kind(records, "generation_started")[-1].members]


# The third --etcd 50-failure run, failure 10: generation 5 was set going by the previous
# failure's tail (started before the Xid, running 1.1 s after it) while GetStatus still said 4.
XID_RACE = [
    started(1, 100.0, 4, ["node-1", "node-2", "spare-5"]),
    running(2, 101.0, 4),
    committed(3, 102.0, 4, 20),
    ended(4, 103.0, 4, ev.END_REASON_HUNG, "node-2", 21),
    started(5, 104.0, 5, ["node-1", "node-2", "spare-5"], restore=20),
    # the Xid is written to spare-5's kernel log at t=105.0, after seq 5 was read
    running(6, 106.1, 5),
    committed(7, 106.5, 5, 21),
    rec(8, 107.0, xid_reported=ev.XidReported(node_id="spare-5", code=79,
                                              action=ev.XID_ACTION_QUARANTINE_NODE)),
    rec(9, 107.0, node_quarantined=ev.NodeQuarantined(node_id="spare-5", reason="Xid 79")),
    ended(10, 107.0, 5, ev.END_REASON_NODE_QUARANTINED, "spare-5", 22),
    started(11, 108.0, 6, ["node-1", "node-2", "spare-6"], restore=21),
    running(12, 110.0, 6),
]


def test_a_generation_set_going_before_the_fault_is_not_its_recovery() -> None:
    old = wall_clock_recovery(XID_RACE, at=105.0, status_generation=4, restarts=True, step=22)
    assert old == 6  # the race: "recovered in 1.1 s", before any Xid verdict

    # Broken at seq 5 with generation 5 taken from the log: the quarantine at seq 10 is its cause.
    owned = attribution.attribute("xid_79", "spare-5", 5, 22, 5, XID_RACE)
    assert owned is not None
    assert (owned.verdict.seq, owned.cause.seq, owned.recovery.seq) == (8, 10, 12)
    assert owned.recovery.event.generation_running.generation == 6 and owned.restore_step == 21
    assert attribution.lost_steps(owned, step_at_break=20) == 1  # trained to 22, restored 21
    # Until the quarantine ended a generation that held spare-5, nothing counts as recovered.
    assert attribution.attribute("xid_79", "spare-5", 5, 22, 5, XID_RACE[:9]) is None


def test_no_failure_is_injected_while_a_started_generation_has_not_run() -> None:
    # GetStatus said RUNNING; the log says generation 4 ended and 5 has not run its first step.
    assert attribution.steady_members(XID_RACE[:5], LIVE) is None
    steady = attribution.steady_members(XID_RACE[:6], LIVE)
    assert steady == Steady(5, ("node-1", "node-2", "spare-5"), {"node-1": 0, "node-2": 1, "spare-5": 2})


def test_an_xid_that_ends_a_later_generation_is_attributed_to_that_end() -> None:
    # Something else (a peer's exit) ends the broken generation first; the Xid then ends the next
    # one, which held its node. Recovery is the generation after that, not the one in between.
    log = [
        started(1, 100.0, 5, ["node-1", "node-2", "spare-5"]),
        running(2, 101.0, 5),
        ended(3, 105.5, 5, ev.END_REASON_TRAINER_EXITED, "node-2", 22),
        started(4, 106.0, 6, ["node-1", "node-2", "spare-5"], restore=22),
        running(5, 107.0, 6),
        rec(6, 108.0, xid_reported=ev.XidReported(node_id="spare-5", code=79)),
        ended(7, 108.0, 6, ev.END_REASON_NODE_QUARANTINED, "spare-5", 23),
        started(8, 109.0, 7, ["node-1", "node-2", "spare-6"], restore=22),
        running(9, 111.0, 7),
    ]
    assert wall_clock_recovery(log, at=105.0, status_generation=5, restarts=True, step=22) == 5
    owned = attribution.attribute("xid_79", "spare-5", 5, 22, 2, log)
    assert owned is not None and (owned.cause.seq, owned.recovery.seq) == (7, 9)


def test_a_node_kill_recovers_when_a_generation_started_after_its_end_runs_and_not_before_its_verdict() -> None:
    log = [
        started(1, 100.0, 3, ["node-1", "node-2", "node-3"]),
        running(2, 101.0, 3),
        ended(3, 106.0, 3, ev.END_REASON_TRAINER_EXITED, "node-2", 15),  # a peer's collective failed first
        started(4, 106.1, 4, ["node-1", "node-2", "node-3"], restore=15),  # node-3 not yet declared dead
        rec(5, 107.0, node_declared_dead=ev.NodeDeclaredDead(node_id="node-3", reason="stream closed")),
        ended(6, 107.0, 4, ev.END_REASON_NODE_LOST, "node-3", 15),
        started(7, 107.2, 5, ["node-1", "node-2", "spare-5"], restore=15),
        running(8, 109.0, 5),
    ]
    assert attribution.attribute("node_kill", "node-3", 3, 15, 2, log[:7]) is None  # 4 never runs
    owned = attribution.attribute("node_kill", "node-3", 3, 15, 2, log)
    assert owned is not None and (owned.verdict.seq, owned.cause.seq, owned.recovery.seq) == (5, 3, 8)
    assert attribution.lost_steps(owned, 15) == 0
    # A restart with no verdict on the victim in the log is not this kill's (the old rule took it).
    unrelated = [r for r in log if r.seq != 5]
    assert wall_clock_recovery(unrelated, at=105.0, status_generation=3, restarts=True, step=15) == 8
    assert attribution.attribute("node_kill", "node-3", 3, 15, 2, unrelated) is None


def test_a_leader_kill_recovers_only_by_a_step_committed_under_a_newer_term() -> None:
    log = [
        started(1, 100.0, 2, ["node-1", "node-2", "node-3"]),
        running(2, 101.0, 2),
        committed(3, 105.001, 2, 31, term=3),  # the killed leader's last append, stamped after the kill
        rec(4, 107.0, term=4, leader_elected=ev.LeaderElected(term=4, address="127.0.0.1:1")),
        committed(5, 108.0, 2, 32, term=4),
    ]
    assert wall_clock_recovery(log, at=105.0, status_generation=2, restarts=False, step=30) == 3
    owned = attribution.attribute("leader_kill", "leader", 2, 30, 2, log, leader_term=3)
    assert owned is not None and (owned.verdict.seq, owned.recovery.seq) == (4, 5)
    assert owned.cause is None and attribution.lost_steps(owned, 30) == 0
    assert attribution.attribute("leader_kill", "leader", 2, 30, 2, log[:4], leader_term=3) is None
    # A stream cut rides on whichever leader: the first step committed past it after the last read.
    for break_seq, recovered in ((2, 3), (3, 5)):
        cut = attribution.attribute("stream_cut", "node-2", 2, 30, break_seq, log)
        assert cut is not None and cut.recovery.seq == recovered


def test_victims_come_only_from_a_running_generation_of_live_fit_members() -> None:
    # The same run, failure 11: the newest GenerationStarted still named spare-5, quarantined and
    # stopped by then, and the kill of its agent raised ProcessLookupError.
    live = LIVE - {"spare-5"}
    stale = [*XID_RACE[:10], started(11, 108.0, 6, ["node-1", "node-2", "spare-5"], restore=21)]
    assert [m for m in last_started_members(stale) if m != "node-1"][-1] == "spare-5"  # the old choice
    assert attribution.steady_members(stale, live) is None  # 6 has not run, and names a quarantined node
    stale.append(running(12, 110.0, 6))
    assert attribution.steady_members(stale, LIVE) is None  # quarantined, though its process lives
    steady = attribution.steady_members(XID_RACE, live)
    assert steady is not None and steady.members == ("node-1", "node-2", "spare-6")
    assert attribution.pick_victim("buddy_loss_in_handoff", steady, "node-1") == "spare-6"
    assert attribution.pick_victim("stream_cut", steady, "node-1") == "node-2"
    assert attribution.pick_victim("leader_kill", steady, "node-1") == "leader"
    # A member whose process the harness saw exit is no victim either.
    assert attribution.steady_members(XID_RACE, live - {"spare-6"}) is None


def test_declared_dead_is_lifted_by_registering_again_and_quarantine_only_by_unquarantine() -> None:
    log = [
        rec(1, 1.0, node_declared_dead=ev.NodeDeclaredDead(node_id="node-2")),
        rec(2, 1.0, node_quarantined=ev.NodeQuarantined(node_id="node-3")),
        rec(3, 2.0, node_registered=ev.NodeRegistered(node_id="node-2", incarnation=2)),
        rec(4, 2.0, node_registered=ev.NodeRegistered(node_id="node-3", incarnation=2)),
    ]
    assert attribution.unfit_nodes(log) == {"node-3"}
    log.append(rec(5, 3.0, node_unquarantined=ev.NodeUnquarantined(node_id="node-3")))
    assert attribution.unfit_nodes(log) == set()


def test_a_consuming_kind_never_takes_the_protected_node() -> None:
    alone = Steady(7, ("node-1",), {"node-1": 0})  # the old rule raised IndexError here
    assert attribution.pick_victim("node_kill", alone, "node-1") is None
    assert attribution.pick_victim("trainer_crash", alone, "node-1") == "node-1"
