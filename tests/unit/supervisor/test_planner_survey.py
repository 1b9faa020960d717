"""The planner's survey of the fleet is kept while nothing it reads changed (plan_memo.survey):
a job waiting for a node asks the planner on every Tick, and a survey walks every node."""

from __future__ import annotations

from ftsup.supervisor.core.inputs import StreamClosed, Tick
from ftsup.supervisor.core.policies import planner
from tests.support.builders import NOW, hello
from tests.unit.supervisor.test_decide import alive, running_cluster


def test_a_waiting_job_surveys_the_fleet_again_only_when_a_record_or_a_stream_changed(monkeypatch):
    sim = running_cluster(spares=0)
    assert sim.state.generation is not None
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 1)
    for t in (1.5, 2.0, 2.5, 3.0, 3.5, 4.0):  # n3 suspected, then dead: the generation ends
        alive(sim, NOW + t - 0.05)
        sim.events(Tick(), at=NOW + t)
    assert sim.state.generation is None
    assert "need 3 healthy nodes, have 2" in sim.waiting_reason

    surveys = []
    real = planner._survey_anew
    monkeypatch.setattr(planner, "_survey_anew", lambda state, soft: surveys.append(1) or real(state, soft))
    for t in (4.1, 4.2, 4.3, 4.4):  # nothing changed: the kept survey answers
        sim.events(Tick(), at=NOW + t)
    assert surveys == [] and "have 2" in sim.waiting_reason

    nodes = sim.state.nodes
    sim.events(StreamClosed("n2", 1, 2), at=NOW + 4.5)  # a stream closed: the node map is the same...
    assert sim.state.nodes is nodes
    assert surveys == [1] and "have 1" in sim.waiting_reason  # ...but the survey is made again

    sim.events(hello("n2", incarnation=2, stream_id=22), at=NOW + 4.7)  # back: surveyed again
    assert "have 2" in sim.waiting_reason and len(surveys) >= 2
