"""Machines branch on types, people read reasons (issue 15): a quarantine's cause decides whether a
reconnect was transient, a standby directive's cause decides whether parked trainers stop; records
written before causes are upcast by the codec."""

from __future__ import annotations

import dataclasses

from ftsup.agent import launcher
from ftsup.supervisor import codec
from ftsup.supervisor.core.directives import Action, StandbyCause, directive_for
from ftsup.supervisor.core.events import (
    NodeDeclaredDead,
    NodeQuarantined,
    NodeUnquarantined,
    QuarantineCause,
    Record,
)
from ftsup.supervisor.core.inputs import StreamClosed, Tick, XidReport
from ftsup.supervisor.core.state import ClusterState
from ftsup.v1 import agent_pb2
from tests.support.builders import NOW, Sim, config, hello
from tests.unit.supervisor.test_decide import alive, running_cluster


def _lose_stream(sim: Sim, node_id: str, stream_id: int, at: float) -> NodeQuarantined:
    sim.events(StreamClosed(node_id, 1, stream_id), at=at)
    sim.events(Tick(), at=at + 0.1)
    alive(sim, at + 1.5, silent=(node_id,))
    events = sim.events(Tick(), at=at + 1.6)
    quarantined = [e for e in events if isinstance(e, NodeQuarantined)]
    dead = [e for e in events if isinstance(e, NodeDeclaredDead)]
    assert len(quarantined) == 1 and len(dead) == 1
    assert dead[0].cause is quarantined[0].cause  # the death says which kind, as its quarantine does
    return quarantined[0]


def test_a_lost_stream_quarantines_with_its_cause_and_the_same_agent_returns_by_it_not_by_its_words():
    sim = running_cluster()
    quarantined = _lose_stream(sim, "n3", 3, NOW + 1.0)
    assert quarantined.cause is QuarantineCause.DEAD_STREAM_LOSS
    assert sim.state.nodes["n3"].quarantine_cause is QuarantineCause.DEAD_STREAM_LOSS
    # The words no longer matter: a reworded reason with the same cause still returns the node.
    node = dataclasses.replace(sim.state.nodes["n3"], quarantine_reason="reworded")
    sim.core.state = dataclasses.replace(sim.state, nodes={**sim.state.nodes, "n3": node})
    events = sim.events(hello("n3", stream_id=33), at=NOW + 3.0)
    assert any(isinstance(e, NodeUnquarantined) for e in events)
    assert sim.state.nodes["n3"].quarantine_cause is QuarantineCause.UNSPECIFIED  # back in service


def test_a_node_quarantined_for_an_xid_stays_quarantined_when_it_reconnects():
    sim = running_cluster()
    sim.events(XidReport("n3", "0000:3b:00.0", 0, 79, "fell off the bus"), at=NOW + 1.0)
    assert sim.state.nodes["n3"].quarantine_cause is QuarantineCause.XID
    sim.events(hello("n3", stream_id=33), at=NOW + 2.0)
    assert sim.state.nodes["n3"].is_quarantined


def test_records_and_snapshots_from_before_causes_are_upcast_from_their_fixed_wording():
    old = NodeQuarantined("n3", "declared dead: stream closed and not reopened within 1s", 4)
    stored = codec.record_to_proto(Record(5, 1, 0.0, old))
    stored.event.node_quarantined.ClearField("cause")  # as an older writer left it
    assert codec.record_from_proto(stored).event.cause is QuarantineCause.DEAD_STREAM_LOSS
    dead = codec.record_to_proto(Record(4, 1, 0.0, NodeDeclaredDead("n3", "no heartbeat for 5.1s (limit 5s)", 5.1)))
    dead.event.node_declared_dead.ClearField("cause")
    assert codec.record_from_proto(dead).event.cause is QuarantineCause.DEAD_SILENT
    xid = codec.event_to_proto(NodeQuarantined("n4", "Xid 79: GPU fell off the bus", 4))
    assert codec.event_from_proto(xid).cause is QuarantineCause.UNSPECIFIED  # nothing branches on it

    sim = running_cluster()
    _lose_stream(sim, "n3", 3, NOW + 1.0)
    snapshot = codec.state_to_proto(sim.state)
    for node in snapshot.nodes:
        node.ClearField("quarantine_cause")
    restored: ClusterState = codec.state_from_proto(snapshot)
    assert restored.nodes["n3"].quarantine_cause is QuarantineCause.DEAD_STREAM_LOSS
    assert restored.nodes["n1"].quarantine_cause is QuarantineCause.UNSPECIFIED


def test_every_standby_directive_says_why_as_a_cause():
    sim = running_cluster()
    cfg = sim.config.job
    assert directive_for(sim.state, cfg, "s1", "").standby_cause is StandbyCause.SPARE
    assert directive_for(sim.state, cfg, "n1", "").action is Action.RUN
    assert directive_for(sim.state, cfg, "n1", "").standby_cause is StandbyCause.UNSPECIFIED
    _lose_stream(sim, "n3", 3, NOW + 1.0)
    directive = directive_for(sim.state, cfg, "n3", "")
    assert directive.standby_cause is StandbyCause.QUARANTINED and directive.reason.startswith("quarantined")
    assert codec.directive_from_proto(codec.directive_to_proto(directive)).standby_cause is StandbyCause.QUARANTINED
    waiting = Sim(config(nodes=3))
    waiting.events(hello("n1", stream_id=1))
    assert directive_for(waiting.state, cfg, "n1", "need 2 more").standby_cause is StandbyCause.WAITING


def test_the_agent_stops_parked_trainers_on_exactly_the_final_standby_causes():
    final = {codec.directive_to_proto(dataclasses.replace(directive_for(ClusterState(), config().job, "x", ""),
                                                          standby_cause=cause)).standby_cause
             for cause in StandbyCause if cause.is_final}
    assert final == set(launcher._FINAL_STANDBY)
    assert agent_pb2.STANDBY_CAUSE_SPARE not in launcher._FINAL_STANDBY
