"""Seqs named before they exist: a quarantine's evidence_seq and an SDC check's id are decided
before the decision is appended, so they must be the seqs the records then get. Each path that
quarantines is driven through Core.step and the records it is stored as; the evidence must be the
record of what the node was quarantined for, in the same append, also when another event is
added in front of it (the drift that hand-computed `applied_seq + offset` seqs suffered)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from ftsup.supervisor.core import faults, liveness, operator_commands, sdc_verdicts
from ftsup.supervisor.core.emission import Emission
from ftsup.supervisor.core.errors import InvalidEvent
from ftsup.supervisor.core.events import (
    EndReason,
    Event,
    GenerationEnded,
    GenerationRunning,
    LeaderElected,
    NodeDeclaredDead,
    NodeQuarantined,
    NodeSuspected,
    OperatorCommand,
    QuarantineCause,
    Record,
    SdcCheckFinished,
    SdcCheckStarted,
    SdcSuspected,
    SdcVerdict,
    StragglerDetected,
    XidAction,
    XidReported,
)
from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.inputs import (
    Heartbeat,
    OperatorCommandKind,
    OperatorRequest,
    SdcCheckResult,
    SnapshotReport,
    StepAggregate,
    StepReport,
    StreamClosed,
    Tick,
    TrainerHung,
    XidReport,
)
from ftsup.supervisor.core.policies.recompute import RecomputeConfig
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.core.step import Core
from tests.support.builders import NOW, Sim, config, hello
from tests.support.evidence import is_evidence_for, seq_problems

DRIFT = LeaderElected(99, "drift", 0)  # folds to nothing: stands in for any event added in front


# -- scenarios: a running job, then the input that quarantines ----------------------------------------



def per_node(reports: tuple[StepReport, ...]) -> list[StepAggregate]:
    """One StepAggregate per node, as agents send them (the core's aggregate is one node's)."""
    by_node: dict[str, list[StepReport]] = {}
    for report in reports:
        by_node.setdefault(report.node_id, []).append(report)
    return [StepAggregate.of_reports(group) for group in by_node.values()]

def _running(cfg=None, spares: int = 1) -> Sim:
    sim = Sim(cfg or config())
    for i in (1, 2, 3):
        sim.events(hello(f"n{i}", stream_id=i))
    for j in range(spares):
        sim.events(hello(f"s{j + 1}", spare=True, stream_id=10 + j))
    assert sim.state.generation is not None
    return sim


def _heard(sim: Sim, at: float) -> None:
    sim.now = at
    for node_id, info in sim.soft.nodes.items():
        if info.stream_id is not None:
            sim.events(Heartbeat(node_id, info.incarnation, 0))


def _step(sim: Sim, n: int, *, skip_rank: int | None = None, grads: dict[int, str] | None = None,
          compute_s: Callable[[int], float] = lambda rank: 0.1) -> list[Event]:
    """Every rank (but `skip_rank`) reports step `n` in one aggregate, then its snapshots land."""
    generation = sim.state.generation
    assert generation is not None
    reports = tuple(
        StepReport(generation.node_of_rank(r) or "", generation.number, r, n, compute_s(r) + 0.1, compute_s(r), 2.0,
                   "d", local_grad_digest=(grads or {}).get(r, f"g{n}.{r}"))
        for r in range(generation.world_size) if r != skip_rank
    )
    out = [event for aggregate in per_node(reports) for event in sim.events(aggregate)]
    for member in generation.members:
        for rank in member.ranks:
            for holder in (member.node_id, member.buddy_node_id):
                if sim.state.generation is generation:
                    out += sim.events(SnapshotReport(holder, generation.number, rank, n, (holder,), 10))
    return out


def xid() -> tuple[Sim, Callable[[Sim], list[Event]]]:
    sim = _running()
    _step(sim, 1)
    _heard(sim, NOW + 5.0)
    return sim, lambda s: s.events(XidReport("n2", "0000:3b:00", 3, 79, "GPU has fallen off the bus."))


def hang() -> tuple[Sim, Callable[[Sim], list[Event]]]:
    sim = _running()
    for n in (1, 2, 3):
        _step(sim, n)
    _step(sim, 4, skip_rank=2)  # every rank but 2 completed step 4: rank 2 is the culprit
    _heard(sim, NOW + 5.0)
    return sim, lambda s: s.events(TrainerHung("n2", 1, 2, 3, 120.0, 60.0))


def straggler() -> tuple[Sim, Callable[[Sim], list[Event]]]:
    sim = _running()
    _heard(sim, NOW + 5.0)

    def slow_steps(s: Sim) -> list[Event]:
        """Rank 3 computes 40 % slower; returns the append that confirms it a straggler."""
        for n in range(1, 40):
            events = _step(s, n, compute_s=lambda rank: 0.14 if rank == 3 else 0.1 + 0.001 * (rank % 3))
            if any(isinstance(e, StragglerDetected) for e in events):
                return events
        raise AssertionError("rank 3 was never confirmed a straggler")
    return sim, slow_steps


def sdc_vote() -> tuple[Sim, Callable[[Sim], list[Event]]]:
    """A minority digest in a step aggregate whose first report marks the generation running:
    GenerationRunning comes before the SdcSuspected evidence in the same append."""
    sim = Sim(config(nodes=4, ranks_per_node=1))
    for i in range(4):
        sim.events(hello(f"n{i + 1}", stream_id=i + 1))
    sim.events(hello("s1", spare=True, stream_id=9))
    sim.now += 10  # past the spare grace

    def flip(s: Sim) -> list[Event]:
        reports = tuple(StepReport(f"n{r + 1}", 1, r, 1, 0.1, 0.05, 2.0, "flipped" if r == 2 else "d")
                        for r in range(4))
        return [event for aggregate in per_node(reports) for event in s.events(aggregate)]
    return sim, flip


def _recompute_cluster(timeout_s: float = 60.0) -> Sim:
    base = config(nodes=4, ranks_per_node=1)
    sim = Sim(dataclasses.replace(base, recompute=RecomputeConfig(every_steps=5, timeout_s=timeout_s)))
    for i in range(4):
        sim.events(hello(f"n{i + 1}", stream_id=i + 1))
    sim.events(hello("s1", spare=True, stream_id=20))
    sim.events(hello("s2", spare=True, stream_id=21))
    return sim


def _answer(sim: Sim, check: SdcCheckStarted, grads: dict[int, str]) -> list[Event]:
    recomputed = tuple(dataclasses.replace(d, node_id=check.verifier_node_id,
                                           grad_digest=grads.get(d.rank, d.grad_digest)) for d in check.reported)
    return sim.events(SdcCheckResult(check.verifier_node_id, check.check_id, check.step, check.rank, recomputed, ""))


def sdc_check() -> tuple[Sim, Callable[[Sim], list[Event]]]:
    """A recompute mismatch confirmed by a second opinion: the culprit's evidence is the
    SdcCheckFinished record (and each check is named after its own record)."""
    sim = _recompute_cluster()
    for n in range(1, 6):
        _step(sim, n)
    (first,) = [e for e in sim.log if isinstance(e, SdcCheckStarted)]
    sim.now += 10
    _, second = _answer(sim, first, {2: "clean"})  # unconfirmed: a second opinion is asked
    assert isinstance(second, SdcCheckStarted) and second.confirms_check_id == first.check_id
    return sim, lambda s: _answer(s, second, {2: "clean"})


def operator() -> tuple[Sim, Callable[[Sim], list[Event]]]:
    sim = _running()
    _step(sim, 1)
    return sim, lambda s: s.events(OperatorRequest(OperatorCommandKind.QUARANTINE, "n2", "bad DIMM", "alice"))


def two_deaths_after_a_check_timed_out() -> tuple[Sim, Callable[[Sim], list[Event]]]:
    """One Tick: an SDC check times out (its finish and the commit it released come first), then
    two nodes are declared dead: each death's quarantine names its own NodeDeclaredDead."""
    sim = _recompute_cluster(timeout_s=30.0)
    for n in range(1, 7):
        _step(sim, n)
    assert sim.state.sdc_checks
    _heard(sim, sim.now + 29.5)
    sim.events(StreamClosed("n2", 1, 2))
    sim.events(StreamClosed("n4", 1, 4))
    assert [type(e) for e in sim.events(Tick())] == [NodeSuspected, NodeSuspected]

    def later(s: Sim) -> list[Event]:
        _heard(s, s.now + 1.5)  # past the recompute timeout and the reconnect grace
        return s.events(Tick())
    return sim, later


class Path(NamedTuple):
    scenario: Callable[[], tuple[Sim, Callable[[Sim], list[Event]]]]
    handler: tuple[Any, str]  # the module attribute decide reaches the evidence through
    causes: tuple[QuarantineCause, ...]
    evidence: tuple[type, ...]


PATHS = {
    "xid": Path(xid, (faults, "on_xid"), (QuarantineCause.XID,), (XidReported,)),
    "hung": Path(hang, (faults, "on_hung"), (QuarantineCause.HUNG,), (GenerationEnded,)),
    "straggler": Path(straggler, (faults, "on_stragglers"), (QuarantineCause.STRAGGLER,), (StragglerDetected,)),
    "sdc vote in an aggregate": Path(sdc_vote, (sdc_verdicts, "on_vote"), (QuarantineCause.SDC,), (SdcSuspected,)),
    "sdc check": Path(sdc_check, (sdc_verdicts, "on_check_result"), (QuarantineCause.SDC,), (SdcCheckFinished,)),
    "operator": Path(operator, (operator_commands, "on_request"), (QuarantineCause.OPERATOR,), (OperatorCommand,)),
    "two deaths in one tick": Path(two_deaths_after_a_check_timed_out, (liveness, "declare_dead"),
                                   (QuarantineCause.DEAD_STREAM_LOSS,), (NodeDeclaredDead,)),
}


def _check(path: Path, sim: Sim, events: list[Event]) -> list[NodeQuarantined]:
    quarantined = [e for e in events if isinstance(e, NodeQuarantined)]
    assert quarantined, f"no quarantine in {events}"
    first_seq = sim.state.applied_seq - len(events) + 1
    for q in quarantined:
        assert q.cause in path.causes
        evidence = sim.records[q.evidence_seq]
        assert is_evidence_for(q, evidence), f"{q} names {evidence}"
        assert first_seq <= q.evidence_seq < first_seq + events.index(q)  # in the same append, before it
        if path.evidence:
            assert isinstance(evidence, path.evidence)
    return quarantined


@pytest.mark.parametrize("name", PATHS)
def test_every_quarantine_names_the_record_it_was_quarantined_for(name):
    path = PATHS[name]
    sim, trigger = path.scenario()
    events = trigger(sim)
    quarantined = _check(path, sim, events)
    if name == "sdc vote in an aggregate":
        assert isinstance(events[0], GenerationRunning)  # an event of the same step before the evidence
    if name == "two deaths in one tick":
        assert {q.node_id for q in quarantined} == {"n2", "n4"}
        (finished,) = [e for e in events if isinstance(e, SdcCheckFinished)]
        assert finished.verdict is SdcVerdict.INCONCLUSIVE  # decided first, in the same Tick
        assert events.index(finished) < min(events.index(q) for q in quarantined)


@pytest.mark.parametrize("name", PATHS)
def test_an_event_added_in_front_of_the_evidence_moves_its_seq_with_it(name, monkeypatch):
    path = PATHS[name]
    sim, trigger = path.scenario()
    module, attr = path.handler
    real = getattr(module, attr)

    def drifted(*args: Any) -> None:
        out: Emission = args[-1]
        out.add(DRIFT)
        real(*args)

    monkeypatch.setattr(module, attr, drifted)
    events = trigger(sim)
    first_seq = sim.state.applied_seq - len(events) + 1
    for q in _check(path, sim, events):
        drift_before = [i for i, e in enumerate(events[:q.evidence_seq - first_seq]) if e == DRIFT]
        assert drift_before, "the drifted handler's extra event comes before the evidence"


# -- the numbering itself --------------------------------------------------------------------------


def test_an_emission_hands_out_the_seqs_its_events_are_stored_under():
    state = evolve_all(ClusterState(), [])
    core = Core(config(), dataclasses.replace(state, applied_seq=41))
    out = Emission(core.state)
    assert out.first_seq == out.next_seq == 42
    first = out.add(LeaderElected(1, "a", 41))
    out.extend([LeaderElected(1, "b", 41), LeaderElected(1, "c", 41)])
    named = out.add_numbered(lambda seq: LeaderElected(1, f"at {seq}", 41))
    records = core.records(out.events, 0.0)
    assert first == records[0].seq == 42
    assert named.address == f"at {records[3].seq}" == "at 45"
    assert out.next_seq == 46 and len(out) == 4


def test_an_emissions_folded_state_is_the_base_with_every_event_added_so_far():
    sim = _running()
    out = Emission(sim.state)
    out.add(NodeSuspected("n1", "quiet", 1.0))
    assert out.folded().nodes["n1"].liveness.value == "suspect"
    out.add(NodeQuarantined("s1", "why", out.first_seq, QuarantineCause.OPERATOR))  # a spare: no generation to end
    assert out.folded() == evolve_all(sim.state, out.events)
    assert out.folded().applied_seq == sim.state.applied_seq  # nothing is appended yet


def test_a_hello_batch_is_numbered_from_the_seq_after_the_state_it_was_decided_on():
    core = Core(config())
    core.advance(*_stored(core, core.step(hello("n1", stream_id=1), NOW)))
    batch = core.step_hellos([(hello("n2", stream_id=2), NOW), (hello("n3", stream_id=3), NOW)])
    assert batch.ready.first_seq == core.state.applied_seq + 1
    core.advance(*_stored(core, batch.ready))
    assert core.state.generation is not None


def _stored(core: Core, ready):
    return ready, core.records(ready.events, NOW)


def test_advance_refuses_records_stored_under_other_seqs_than_the_decision_named():
    # A record folded between step and advance (a follower's copy, a second writer) shifts every
    # seq by one: the quarantine would name the record before its evidence.
    sim, trigger = xid()
    ready = sim.core.step(XidReport("n2", "0000:3b:00", 3, 79, "GPU has fallen off the bus."), sim.now)
    assert any(isinstance(e, NodeQuarantined) for e in ready.events)
    sim.core.fold([Record(sim.state.applied_seq + 1, 0, 0.0, DRIFT)])
    before = sim.state
    with pytest.raises(InvalidEvent, match="decided to be appended from seq"):
        sim.core.advance(ready, sim.core.records(ready.events, sim.now))
    assert sim.state is before


def test_the_check_catches_a_quarantine_naming_another_record():
    log = {1: XidReported("n2", "p", 0, 79, XidAction.QUARANTINE_NODE, "m", False),
           2: GenerationEnded(1, EndReason.NODE_QUARANTINED, "n2", 3, "x")}
    right = Record(3, 0, 0.0, NodeQuarantined("n2", "xid", 1, QuarantineCause.XID))
    shifted = Record(3, 0, 0.0, NodeQuarantined("n2", "xid", 2, QuarantineCause.XID))
    assert seq_problems([right], {**log, 3: right.event}) == []
    assert seq_problems([shifted], {**log, 3: shifted.event})
    misnamed = Record(4, 0, 0.0, SdcCheckStarted("sdc-3", 5, 2, "n3", "s1", 1, "x"))
    assert seq_problems([misnamed], {4: misnamed.event})
