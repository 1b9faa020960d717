"""Refusals added after the issue-8 wire fuzz test found these messages accepted (pure core)."""

from __future__ import annotations

import math

import pytest

from ftsup.supervisor.core.inputs import RankFinished, TrainerExit, TrainerHung, XidReport
from tests.support.builders import NOW, Sim, hello


def running() -> Sim:
    sim = Sim()  # 3 nodes x 2 ranks: n1 holds 0-1, n2 holds 2-3, n3 holds 4-5
    for i in (1, 2, 3):
        sim.events(hello(f"n{i}", stream_id=i))
    sim.events(hello("s1", spare=True, stream_id=10))
    assert sim.state.generation is not None and sim.state.generation.number == 1
    return sim


def test_a_trainer_exit_for_a_rank_the_sender_does_not_run_is_refused_and_ends_nothing() -> None:
    sim = running()
    assert "does not hold rank 0" in sim.feed(TrainerExit("n2", 1, 0, -9, False))
    assert "does not hold rank 0" in sim.feed(TrainerExit("s1", 1, 0, -9, False))
    assert sim.state.generation is not None and sim.state.generation.number == 1


def test_a_trainer_exit_for_a_generation_never_started_is_refused() -> None:
    sim = running()
    assert "generation 7 was never started (the newest is 1)" in sim.feed(TrainerExit("n1", 7, 0, 1, False))


def test_a_trainer_exit_of_an_older_generation_is_still_accepted_as_a_no_op() -> None:
    sim = running()
    assert sim.feed(TrainerExit("n1", 0, 0, 1, False)) == []


@pytest.mark.parametrize("times", [(math.nan, 60.0), (-1.0, 60.0), (120.0, math.inf), (120.0, -5.0), (1e18, 60.0)])
def test_a_hang_report_with_impossible_times_is_refused(times: tuple[float, float]) -> None:
    sim = running()
    assert "is not a finite number of seconds" in sim.feed(TrainerHung("n2", 1, 2, 3, *times), at=NOW + 5.0)
    assert sim.state.generation is not None and sim.state.generation.number == 1


def test_rank_finished_again_with_another_digest_is_refused_the_same_one_is_a_no_op() -> None:
    sim = running()
    assert sim.feed(RankFinished("n1", 1, 0, 10, "abc")) == []
    assert sim.feed(RankFinished("n1", 1, 0, 10, "abc")) == []  # agents re-send after a reconnect
    assert "already finished generation 1 with digest 'abc'" in sim.feed(RankFinished("n1", 1, 0, 10, "evil"))
    assert sim.soft.progress is not None and sim.soft.progress.finished[0] == "abc"


def test_an_overlong_pci_id_is_named_as_such() -> None:
    sim = running()
    assert "PCI bus id of 65 characters" in sim.feed(XidReport("n1", "0" * 65, None, 79, "fell off the bus"))


def test_a_snapshot_memory_report_is_shown_for_its_node_and_nonsense_is_refused() -> None:
    from ftsup.supervisor.core.inputs import SnapshotMemoryReport
    from ftsup.supervisor.core.views import node_views

    sim = running()
    report = SnapshotMemoryReport("n2", 3 << 30, 3 << 30, "derived", 4, "4 ranks x 4 copies")
    assert sim.feed(report) == []  # nothing to decide: for operators
    shown = {v.node_id: v.snapshot_memory for v in node_views(sim.state, sim.soft, NOW)}
    assert shown["n2"] == report and shown["n1"] is None
    assert "is not one of derived, flag_cap" in sim.feed(SnapshotMemoryReport("n1", 1, None, "guess", 1, ""))
    assert "figures out of range" in sim.feed(SnapshotMemoryReport("n1", 1 << 60, None, "ram_cap", 1, ""))
    assert "has not said Hello" in sim.feed(SnapshotMemoryReport("ghost", 1, None, "ram_cap", 1, ""))


# Ids the core's older rule (1-64 of [A-Za-z0-9._-]) let in and the server's Hello check refuses.
OLD_FORM_IDS = ["Node-1", "node_1", "-node1", "node1.", "a..b", ".", "n" * 64]


@pytest.mark.parametrize("node_id", OLD_FORM_IDS)
def test_a_hello_with_an_old_form_node_id_is_refused_by_the_core_as_the_server_refuses_it(node_id: str) -> None:
    from ftsup.common.node_id import node_id_problem
    from ftsup.supervisor.core.step import Core, RefusalKind
    from tests.support.builders import config

    core = Core(config())
    ready = core.step(hello(node_id), NOW)
    assert ready.refusal is not None and ready.refusal.kind is RefusalKind.PERMANENT
    assert ready.refusal.reason == node_id_problem(node_id)  # the one rule, word for word
    assert ready.events == () and node_id not in core.soft.nodes
    batch = core.step_hellos([(hello(node_id), NOW), (hello("node-1.rack-2"), NOW)])
    assert batch.refusals[0] is not None and batch.refusals[0].kind is RefusalKind.PERMANENT
    assert batch.admitted == (1,)
