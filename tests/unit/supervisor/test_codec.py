"""Every event kind crosses the proto codec and comes back equal; none lacks a mapping."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.v1 import events_pb2
from supervisor import codec
from supervisor.core import events as ev
from supervisor.core.directives import Action, Directive, EnvVar, RestoreFrom
from tests.support.strategies import STRATEGIES, finite, text, u32, u64

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
