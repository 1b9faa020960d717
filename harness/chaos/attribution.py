"""Which records belong to which soak failure: the victim it may pick, and its cause and recovery.

A soak breaks one job many times in a row, so the log holds the tail of the previous failure
while the next one starts. Judging by wall-clock ("the first generation running after the
fault") then credits a failure with a generation that an earlier event had already set going,
and picks victims from a member list that names a node already dead. Everything here is
decided from the records' order instead (seqs, generation numbers, node ids), as pure
functions over `events_pb2.Record` lists, so hand-built logs test them in milliseconds:

- a failure is injected only while one generation runs whose every member is live and fit
  (`steady_members`), and its victim is one of those members (`pick_victim`);
- its cause is the record, after the last one read before the fault (`break_seq`), that ended
  the broken generation because of it (restarting kinds), or the fault's verdict (the others);
- its recovery is the first GenerationRunning of a generation started after that cause, or
  for kinds that must not restart, a step committed after the fault (under a newer leader
  term for a leader kill).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ftsup.harness.chaos.checks import kind
from ftsup.v1 import events_pb2

# Kinds that end the generation (recovery = a later generation's first step); the others do not.
RESTARTS = frozenset({"node_kill", "hung_trainer", "xid_79", "buddy_loss_in_handoff", "trainer_crash"})
# Kinds that take a node out of the job for good: a fresh spare joins once the job recovered.
CONSUMES_NODE = frozenset({"node_kill", "xid_79", "buddy_loss_in_handoff"})
# An Xid 79's only way to end a generation: its node quarantined (or, under a restart policy, Xid).
XID_ENDS = frozenset({events_pb2.END_REASON_NODE_QUARANTINED, events_pb2.END_REASON_XID})


def running_generation(records: Sequence[events_pb2.Record]) -> events_pb2.GenerationStarted | None:
    """The newest generation started, once it ran its first step, while it has not ended."""
    started: events_pb2.GenerationStarted | None = None
    running = ended = False
    for record in records:
        what = kind(record)
        if what == "generation_started":
            started, running, ended = record.event.generation_started, False, False
        elif started is None:
            continue
        elif what == "generation_running" and record.event.generation_running.generation == started.generation:
            running = True
        elif what == "generation_ended" and record.event.generation_ended.generation == started.generation:
            ended = True
    return started if started is not None and running and not ended else None


def unfit_nodes(records: Sequence[events_pb2.Record]) -> set[str]:
    """Nodes the log says are out: declared dead (until heard again) or quarantined (until lifted)."""
    dead: set[str] = set()
    quarantined: set[str] = set()
    for record in records:
        what = kind(record)
        if what == "node_declared_dead":
            dead.add(record.event.node_declared_dead.node_id)
        elif what in ("node_registered", "node_cleared"):
            dead.discard(getattr(record.event, what).node_id)
        elif what == "node_quarantined":
            quarantined.add(record.event.node_quarantined.node_id)
        elif what == "node_unquarantined":
            quarantined.discard(record.event.node_unquarantined.node_id)
    return dead | quarantined


@dataclass(frozen=True, slots=True)
class Steady:
    """A generation that may be broken now: it runs, and each member is live and fit."""

    generation: int
    members: tuple[str, ...]  # node ids, in rank order
    ranks: dict[str, int]  # node id -> its first rank


def steady_members(records: Sequence[events_pb2.Record], live: Collection[str]) -> Steady | None:
    """The generation now running, when every member's agent is live (`live`: the harness's view
    of processes) and the log has declared none dead or quarantined; else None: an end is
    pending, and a failure injected now would mix with it."""
    started = running_generation(records)
    if started is None:
        return None
    unfit = unfit_nodes(records)
    assignments = sorted(started.members, key=lambda m: min(m.ranks, default=0))
    members = tuple(m.node_id for m in assignments)
    if not members or any(m not in live or m in unfit for m in members):
        return None
    return Steady(int(started.generation), members, {m.node_id: min(m.ranks, default=0) for m in assignments})


def pick_victim(kind_: str, steady: Steady, protected: str) -> str | None:
    """The node a failure of `kind_` hits, among the steady generation's members. A kind that
    consumes its node never takes `protected` (it carries the start-to-end baseline): the last
    other member; the others take the second member (the first when alone). None: no fit node."""
    if kind_ == "leader_kill":
        return "leader"
    if kind_ in CONSUMES_NODE:
        others = [m for m in steady.members if m != protected]
        return others[-1] if others else None
    return steady.members[1] if len(steady.members) > 1 else steady.members[0]


@dataclass(frozen=True, slots=True)
class Attribution:
    """The records one failure owns: the verdict on its victim, what ended its generation (restarting
    kinds), and the record that completed its recovery."""

    verdict: events_pb2.Record | None
    cause: events_pb2.Record | None
    recovery: events_pb2.Record
    restore_step: int | None  # restarting kinds: the step the recovering generation restored (None: fresh)


def verdict_record(kind_: str, victim: str, break_seq: int, records: Sequence[events_pb2.Record],
                   leader_term: int = 0) -> events_pb2.Record | None:
    """The supervisor's verdict on this fault, after `break_seq`: the victim declared dead (kills),
    its Xid reported, a new leader of a higher term, or, for a trainer hung or crashed, the end of
    a generation (their detection is that end)."""
    for record in records:
        if record.seq <= break_seq:
            continue
        what = kind(record)
        if kind_ in ("node_kill", "buddy_loss_in_handoff"):
            if what == "node_declared_dead" and record.event.node_declared_dead.node_id == victim:
                return record
        elif kind_ == "xid_79":
            if what == "xid_reported" and record.event.xid_reported.node_id == victim:
                return record
        elif kind_ == "leader_kill":
            if what == "leader_elected" and record.event.leader_elected.term > leader_term:
                return record
        elif kind_ in ("hung_trainer", "trainer_crash"):
            if what == "generation_ended" and record.event.generation_ended.reason != events_pb2.END_REASON_COMPLETED:
                return record
    return None


def cause_record(kind_: str, victim: str, generation: int, break_seq: int,
                 records: Sequence[events_pb2.Record]) -> events_pb2.Record | None:
    """The record, after `break_seq`, that ended generation `generation` (the one running when the
    fault was injected) because of this fault. An Xid ends a generation only by naming its node
    (a quarantine, or an Xid restart), and if something else ended the broken one first, the
    Xid ends the next one that still holds its node: that end is its cause. The kinds that kill
    or stop a process may end it through any member (a peer's collective fails before the
    victim is declared dead), so there it is the broken generation's first end that is not a
    completion."""
    for record in records:
        if record.seq <= break_seq or kind(record) != "generation_ended":
            continue
        end = record.event.generation_ended
        if end.reason == events_pb2.END_REASON_COMPLETED:
            continue
        if kind_ == "xid_79":  # whichever generation its node's quarantine hit
            if end.generation >= generation and end.reason in XID_ENDS and end.node_id == victim:
                return record
        elif end.generation == generation:
            return record
    return None


def attribute(kind_: str, victim: str, generation: int, step: int, break_seq: int,
              records: Sequence[events_pb2.Record], leader_term: int = 0) -> Attribution | None:
    """This failure's records once it recovered, else None (not yet).

    Restarting kinds: the first GenerationRunning of a generation whose GenerationStarted comes
    after the cause, and (kills, Xid) only once the verdict on the victim is in the log. The
    others: the first SnapshotCommitted past `step` after the fault; for a leader kill, once a
    leader of a higher term was elected, and committed in such a term (the old leader's last
    appends do not count)."""
    verdict = verdict_record(kind_, victim, break_seq, records, leader_term)
    if kind_ not in RESTARTS:
        if kind_ == "leader_kill" and verdict is None:
            return None
        for record in records:
            if record.seq > break_seq and kind(record) == "snapshot_committed" \
                    and record.event.snapshot_committed.step > step \
                    and (kind_ != "leader_kill" or record.term > leader_term):
                return Attribution(verdict, None, record, None)
        return None
    cause = cause_record(kind_, victim, generation, break_seq, records)
    if cause is None or verdict is None:
        return None
    starts: dict[int, events_pb2.GenerationStarted] = {}
    for record in records:
        if record.seq <= cause.seq:
            continue
        what = kind(record)
        if what == "generation_started":
            starts[record.event.generation_started.generation] = record.event.generation_started
        elif what == "generation_running" and record.event.generation_running.generation in starts:
            started = starts[record.event.generation_running.generation]
            restore = int(started.restore_step) if started.HasField("restore_step") else None
            return Attribution(verdict, cause, record, restore)
    return None


def lost_steps(attribution: Attribution, step_at_break: int) -> int:
    """Steps trained before the fault that had to be trained again: the last step the broken
    generation reached (its end, or what was seen at the break) minus the step its recovery
    restored (none: a fresh start, all of them). 0 for kinds that do not restart."""
    if attribution.cause is None:
        return 0
    last = max(int(attribution.cause.event.generation_ended.last_step), step_at_break)
    return max(0, last - (attribution.restore_step or 0))
