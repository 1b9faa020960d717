"""Every event kind crosses the proto codec and comes back equal; none lacks a mapping."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor import codec
from ftsup.supervisor.core import events as ev
from ftsup.supervisor.core.directives import (
    Action,
    Directive,
    EnvVar,
    PeerGrant,
    RestoreFrom,
    SdcCheckOrder,
    SdcSnapshotSource,
    StandbyCause,
)
from ftsup.v1 import events_pb2
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


directives = st.builds(
    Directive, u64, st.sampled_from(Action), st.lists(u32, max_size=3).map(tuple), u32, text, u32,
    st.lists(text, max_size=3).map(tuple), st.lists(st.builds(EnvVar, text, text), max_size=2).map(tuple),
    st.none() | u64, st.lists(st.builds(RestoreFrom, u32, st.sampled_from(ev.RestoreKind), text, text,
                                        st.none() | u32), max_size=2).map(tuple),
    text, text, u64, text, st.lists(u64, max_size=3).map(tuple),
    st.lists(st.builds(
        SdcCheckOrder, text, u64, u64, u32, u32, st.lists(u32, max_size=3).map(tuple),
        st.lists(st.builds(SdcSnapshotSource, text, text), max_size=2).map(tuple),
        st.lists(text, max_size=2).map(tuple), st.lists(st.builds(EnvVar, text, text), max_size=2).map(tuple),
    ), max_size=2).map(tuple),
    peer_grants=st.lists(st.builds(PeerGrant, text, st.lists(u32, max_size=3).map(tuple),
                                   st.lists(u32, max_size=3).map(tuple)), max_size=2).map(tuple),
    standby_cause=st.sampled_from(StandbyCause),
)


@settings(max_examples=100, deadline=None)
@given(directives)
def test_directives_round_trip(directive):
    assert codec.directive_from_proto(codec.directive_to_proto(directive)) == directive


@settings(max_examples=100, deadline=None)
@given(directives, st.lists(st.tuples(directives, st.sets(st.sampled_from([f.name for f in dataclasses.fields(Directive)]))),
                            max_size=6))
def test_a_push_encoded_against_templates_equals_each_directive_encoded_alone(base, others):
    """Each directive takes some fields from `base` (the same objects, as a push shares them) and
    the rest from another directive: every field kind differs from its template in some example
    (to or from empty, None, another enum), and the actions mix."""
    push = [base] + [dataclasses.replace(base, **{name: getattr(other, name) for name in names})
                     for other, names in others]
    encoder = codec.DirectiveEncoder()
    for directive in push:
        assert encoder.encode(directive) == codec.directive_to_proto(directive)


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
    from ftsup.supervisor.core import state as core_state
    from ftsup.v1 import state_pb2

    for cls in (core_state.ClusterState, core_state.NodeRecord, core_state.Generation, core_state.EndedGeneration,
                core_state.CommittedSnapshot, core_state.Completion, core_state.CommittedCheckpoint,
                core_state.PendingCheckpoint):
        proto = getattr(state_pb2, cls.__name__)
        stored = {f.name for f in dataclasses.fields(cls) if f.init}  # init=False: derived (an index), not state
        assert stored == set(proto.DESCRIPTOR.fields_by_name), cls.__name__


def test_open_sdc_checks_and_an_sdc_result_round_trip_through_a_state_snapshot_and_the_wire():
    from ftsup.supervisor.core.state import ClusterState
    from ftsup.supervisor.server.agent_service import to_input
    from ftsup.v1 import agent_pb2, state_pb2

    digests = (ev.SdcRankDigests(0, "n1", "g0", "p"), ev.SdcRankDigests(2, "n3", "g2", "p"))
    check = ev.SdcCheckStarted("sdc-7", 5, 2, "n3", "s1", 1, "scheduled", "", digests, (), ("n4", "n3"), 4)
    state = ClusterState(sdc_checks=(check,), sdc_tainted_from_step=5)
    wire = codec.state_to_proto(state).SerializeToString()
    assert codec.state_from_proto(state_pb2.ClusterState.FromString(wire)) == state

    message = agent_pb2.AgentMessage(sdc_check_result=agent_pb2.SdcCheckResult(
        check_id="sdc-7", step=5, rank=2, error="", replay_s=1.5,
        recomputed=[events_pb2.SdcRankDigests(rank=2, node_id="forged", grad_digest="g2x", param_digest="q")]))
    inp = to_input("s1", 1, agent_pb2.AgentMessage.FromString(message.SerializeToString()))
    # The digests are the sender's: the node id comes from the stream, not from the message.
    assert inp is not None and inp.recomputed == (ev.SdcRankDigests(2, "s1", "g2x", "q"),)


def _field_by_field(message, name, items):
    """The plain path the compiled adders must match: one attribute set per field per item."""
    target = getattr(message, name)
    for item in items:
        codec.to_proto(item, target.add())


@settings(max_examples=200, deadline=None)
@given(st.one_of(*STRATEGIES.values()))
def test_compiled_item_adders_encode_every_event_as_the_field_by_field_path_does(event):
    fast = codec.event_to_proto(event).SerializeToString(deterministic=True)
    compiled = codec._add_items
    codec._add_items = _field_by_field
    try:
        plain = codec.event_to_proto(event).SerializeToString(deterministic=True)
    finally:
        codec._add_items = compiled
    assert fast == plain


def test_a_generation_with_optional_and_every_enum_value_encodes_as_the_field_by_field_path_does():
    restores = tuple(ev.RankRestore(r, kind, f"n{r}", None if r % 2 else r + 7)
                     for r, kind in enumerate(list(ev.RestoreKind) * 2))
    members = (ev.RankAssignment("n0", (0, 1, 2, 3), "n1"), ev.RankAssignment("n1", (4, 5, 6, 7), "n0"))
    event = ev.GenerationStarted(1, members, 8, "10.0.0.1", 29500, None, 0, restores, "fresh")
    message = codec.event_to_proto(event)
    assert [r.HasField("source_rank") for r in message.generation_started.restores] == [r % 2 == 0 for r in range(8)]
    assert codec.event_from_proto(message) == event


def test_a_bad_value_in_a_long_list_is_refused_naming_the_item_and_field():
    restores = (ev.RankRestore(0, ev.RestoreKind.FRESH, ""), ev.RankRestore(-1, ev.RestoreKind.FRESH, ""))
    event = ev.GenerationStarted(1, (), 2, "h", 1, None, 0, restores, "")
    with pytest.raises(codec.CodecError, match=r"RankRestore\.rank=-1"):  # a negative rank is no uint32
        codec.event_to_proto(event)


def test_a_pending_checkpoints_written_ranks_round_trip_and_keep_growing_after_a_snapshot():
    from ftsup.supervisor.codec import state_from_proto, state_to_proto
    from ftsup.supervisor.core.events import CheckpointShardWritten
    from ftsup.supervisor.core.evolve import evolve
    from ftsup.supervisor.core.grow_only import GrowOnly
    from ftsup.supervisor.core.state import ClusterState, PendingCheckpoint, ShardRecord

    records = GrowOnly([ShardRecord(2, "k2", "a" * 64, 10), ShardRecord(0, "k0", "b" * 64, 11)])
    pending = PendingCheckpoint("ck", 1, 8, 4, written=GrowOnly([2, 0]), records=records, location="s3://b/p")
    state = ClusterState(pending_checkpoint=pending)
    back = state_from_proto(state_to_proto(state))
    assert back == state and isinstance(back.pending_checkpoint.written, GrowOnly)
    grown = evolve(back, CheckpointShardWritten("ck", 3, "k3", "c" * 64, 12))
    assert grown.pending_checkpoint.written == (2, 0, 3) and 3 in grown.pending_checkpoint.written
    assert back.pending_checkpoint.written == (2, 0)  # the decoded state is unchanged
