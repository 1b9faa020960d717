"""SDC through the pure core: a minority digest quarantines its node and the job restarts from the
last step whose digests agreed; tainted steps are never committed or restored."""

from __future__ import annotations

import pytest

from ftsup.supervisor.core.errors import InvalidEvent
from ftsup.supervisor.core.events import (
    EndReason,
    GenerationEnded,
    GenerationStarted,
    NodeQuarantined,
    SdcSuspected,
    SnapshotCommitted,
)
from ftsup.supervisor.core.evolve import evolve
from ftsup.supervisor.core.inputs import SnapshotReport, StepReport
from tests.support.builders import Sim, config, hello

NODES = ("n1", "n2", "n3", "n4")


def cluster() -> Sim:
    """Four nodes of one rank each (four data-parallel replicas) and one spare, generation 1."""
    sim = Sim(config(nodes=4, ranks_per_node=1))
    for i, node in enumerate(NODES):
        sim.events(hello(node, stream_id=i + 1))
    sim.events(hello("s1", spare=True, stream_id=9))
    assert sim.state.generation is not None and sim.state.generation.number == 1
    return sim


def snapshots(sim: Sim, step: int) -> list:
    """Every rank's snapshot of `step` held by its node and its buddy."""
    out = []
    generation = sim.state.generation
    assert generation is not None
    for member in generation.members:
        for holder in (member.node_id, member.buddy_node_id):
            out += sim.events(SnapshotReport(holder, generation.number, member.ranks[0], step, (holder,), 10))
    return out


def reports(sim: Sim, step: int, digests: dict[int, str]) -> list:
    out = []
    generation = sim.state.generation
    assert generation is not None
    for rank, digest in sorted(digests.items()):
        out += sim.events(StepReport(generation.node_of_rank(rank), generation.number, rank, step, 0.1, 0.05, 2.0, digest))
    return out


def clean(sim: Sim, step: int) -> None:
    reports(sim, step, {r: f"d{step}" for r in range(4)})
    snapshots(sim, step)
    assert sim.state.snapshot is not None and sim.state.snapshot.step == step


def test_a_minority_digest_quarantines_its_node_and_the_spare_restores_the_step_before():
    sim = cluster()
    for step in (1, 2, 3):
        clean(sim, step)
    # Step 4's snapshots land before the last digest: held twice, but not committable yet.
    reports(sim, 4, {0: "d4", 1: "d4", 2: "flipped"})
    assert snapshots(sim, 4) == []
    sim.now += 10  # past the spare grace: the spare may stand in
    events = reports(sim, 4, {3: "d4"})
    suspected, ended, quarantined, started = events
    assert suspected == SdcSuspected("n3", 2, 4, "flipped", "d4", 1, 4)
    assert isinstance(ended, GenerationEnded) and ended.reason is EndReason.NODE_QUARANTINED and ended.node_id == "n3"
    assert "rank 2 flipped vs majority d4" in ended.detail
    assert isinstance(quarantined, NodeQuarantined) and quarantined.node_id == "n3"
    assert sim.log[quarantined.evidence_seq - 1] == suspected  # the evidence is the SdcSuspected record
    assert isinstance(started, GenerationStarted) and started.restore_step == 3
    assert [m.node_id for m in started.members] == ["n1", "n2", "s1", "n4"]
    assert sim.state.sdc_tainted_from_step is None  # lifted: the new generation recomputes step 4
    assert sim.state.snapshot is not None and sim.state.snapshot.step == 3


def test_snapshots_of_a_diverged_step_or_later_are_never_committed():
    sim = cluster()
    clean(sim, 1)
    snapshots(sim, 2)
    snapshots(sim, 3)
    reports(sim, 2, {0: "a", 1: "b", 2: "a", 3: "b"})  # split at step 2: the generation ends
    assert SnapshotCommitted(1, 2) not in sim.log and SnapshotCommitted(1, 3) not in sim.log


def test_an_even_split_restarts_from_the_last_agreed_step_without_quarantining_anyone():
    sim = cluster()
    clean(sim, 1)
    events = reports(sim, 2, {0: "a", 1: "b", 2: "b", 3: "a"})
    suspects = [e for e in events if isinstance(e, SdcSuspected)]
    assert [(s.node_id, s.majority_digest) for s in suspects] == [("n1", ""), ("n2", ""), ("n3", ""), ("n4", "")]
    (ended,) = [e for e in events if isinstance(e, GenerationEnded)]
    assert ended.reason is EndReason.SDC and "no majority names a culprit" in ended.detail
    assert not any(isinstance(e, NodeQuarantined) for e in events)
    (started,) = [e for e in events if isinstance(e, GenerationStarted)]
    assert started.restore_step == 1 and [m.node_id for m in started.members] == list(NODES)


def test_agreeing_digests_commit_as_before():
    sim = cluster()
    snapshots(sim, 1)  # held first, digests after: the last digest commits the step
    assert reports(sim, 1, {r: "same" for r in range(4)})[-1] == SnapshotCommitted(1, 1)


def test_the_log_refuses_to_commit_or_restore_a_tainted_step():
    sim = cluster()
    clean(sim, 1)
    state = evolve(sim.state, SdcSuspected("n2", 1, 2, "x", "y", 1, 4))
    assert state.sdc_tainted_from_step == 2
    with pytest.raises(InvalidEvent, match="steps from 2 on are SDC-tainted"):
        evolve(state, SnapshotCommitted(1, 2))
    assert evolve(state, SdcSuspected("n2", 1, 5, "x", "y", 1, 4)).sdc_tainted_from_step == 2  # the first counts
