"""Every event kind crosses the proto codec and comes back equal; none lacks a mapping."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.v1 import events_pb2
from supervisor import codec
from supervisor.core import events as ev
from supervisor.core.directives import Action, Directive, EnvVar, RestoreFrom

text = st.text(max_size=12)
u64 = st.integers(0, 2**63)
u32 = st.integers(0, 2**31)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)

assignment = st.builds(ev.RankAssignment, text, st.lists(u32, max_size=4).map(tuple), text)
restore = st.builds(ev.RankRestore, u32, st.sampled_from(ev.RestoreKind), text)

STRATEGIES = {
    ev.NodeRegistered: st.builds(ev.NodeRegistered, text, u64, st.sampled_from(ev.NodeRole), text, u32, u32),
    ev.NodeSuspected: st.builds(ev.NodeSuspected, text, text, finite),
    ev.NodeCleared: st.builds(ev.NodeCleared, text, text),
    ev.NodeDeclaredDead: st.builds(ev.NodeDeclaredDead, text, text, finite),
    ev.NodeQuarantined: st.builds(ev.NodeQuarantined, text, text, u64),
    ev.GenerationStarted: st.builds(
        ev.GenerationStarted, u64, st.lists(assignment, max_size=3).map(tuple), u32, text, u32,
        st.none() | u64, u64, st.lists(restore, max_size=3).map(tuple), text,
    ),
    ev.GenerationRunning: st.builds(ev.GenerationRunning, u64, u64),
    ev.GenerationEnded: st.builds(ev.GenerationEnded, u64, st.sampled_from(ev.EndReason), text, u64, text),
    ev.SnapshotCommitted: st.builds(ev.SnapshotCommitted, u64, u64),
    ev.JobCompleted: st.builds(ev.JobCompleted, u64, u64, text),
    ev.XidReported: st.builds(ev.XidReported, text, text, st.none() | u32, u32, st.sampled_from(ev.XidAction), text,
                              st.booleans()),
    ev.NodeUnquarantined: st.builds(ev.NodeUnquarantined, text, text, text),
    ev.NodeDrained: st.builds(ev.NodeDrained, text, text, text),
    ev.StragglerDetected: st.builds(ev.StragglerDetected, text, u32, finite, u32, u32, text),
    ev.CheckpointStarted: st.builds(ev.CheckpointStarted, text, u64, u64, u32, text),
    ev.CheckpointShardWritten: st.builds(ev.CheckpointShardWritten, text, u32, text, text, u64),
    ev.CheckpointCommitted: st.builds(ev.CheckpointCommitted, text, u64, text),
    ev.CheckpointAborted: st.builds(ev.CheckpointAborted, text, text),
    ev.SdcCheckStarted: st.builds(ev.SdcCheckStarted, text, u64, u32, text, text),
    ev.SdcCheckFinished: st.builds(ev.SdcCheckFinished, text, st.sampled_from(ev.SdcVerdict), text, text),
    ev.SdcSuspected: st.builds(ev.SdcSuspected, text, u32, u64, text, text),
    ev.OperatorCommand: st.builds(ev.OperatorCommand, text, st.lists(text, max_size=3).map(tuple), text, text),
}


def test_every_event_kind_has_a_strategy_and_a_proto_case():
    assert set(STRATEGIES) == set(ev.EVENT_TYPES)
    proto_cases = {f.name for f in events_pb2.Event.DESCRIPTOR.oneofs_by_name["kind"].fields}
    assert proto_cases == {codec._snake(cls.__name__) for cls in ev.EVENT_TYPES}


@settings(max_examples=200, deadline=None)
@given(st.one_of(*STRATEGIES.values()), u64, u64, finite)
def test_records_round_trip_through_bytes(event, seq, term, when):
    record = ev.Record(seq, term, when, event)
    wire = codec.record_to_proto(record).SerializeToString()
    assert codec.record_from_proto(events_pb2.Record.FromString(wire)) == record


@settings(max_examples=100, deadline=None)
@given(st.builds(
    Directive, u64, st.sampled_from(Action), st.lists(u32, max_size=3).map(tuple), u32, text, u32,
    st.lists(text, max_size=3).map(tuple), st.lists(st.builds(EnvVar, text, text), max_size=2).map(tuple),
    st.none() | u64, st.lists(st.builds(RestoreFrom, u32, st.sampled_from(ev.RestoreKind), text, text), max_size=2).map(tuple),
    text, text, u64, text,
))
def test_directives_round_trip(directive):
    assert codec.directive_from_proto(codec.directive_to_proto(directive)) == directive


def test_an_event_from_a_newer_writer_is_a_clear_error():
    message = events_pb2.Event()
    try:
        codec.event_from_proto(message)
    except codec.CodecError as exc:
        assert "no kind" in str(exc)
    else:
        raise AssertionError("an empty Event must not decode")


def test_core_event_fields_match_their_proto_messages():
    for cls in ev.EVENT_TYPES:
        proto = getattr(events_pb2, cls.__name__)
        assert {f.name for f in dataclasses.fields(cls)} == set(proto.DESCRIPTOR.fields_by_name), cls.__name__


def test_every_cluster_state_field_has_a_snapshot_field():
    from ftsup.v1 import state_pb2
    from supervisor.core import state as core_state

    for cls in (core_state.ClusterState, core_state.NodeRecord, core_state.Generation, core_state.EndedGeneration,
                core_state.CommittedSnapshot, core_state.Completion, core_state.CommittedCheckpoint,
                core_state.PendingCheckpoint):
        proto = getattr(state_pb2, cls.__name__)
        assert {f.name for f in dataclasses.fields(cls)} == set(proto.DESCRIPTOR.fields_by_name), cls.__name__
