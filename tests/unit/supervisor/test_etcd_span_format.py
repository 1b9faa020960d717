"""The span value format of the etcd log (pure): one value holding every record of one append."""

from __future__ import annotations

import pytest

from ftsup.supervisor import codec
from ftsup.supervisor.core.events import NodeCleared, Record
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.etcd_blobs import is_pointer, split
from ftsup.supervisor.eventlog.etcd_spans import SpanFormatError, decode_span, encode_span, is_span


def raw(seq: int, reason: str = "r") -> bytes:
    return codec.record_to_proto(Record(seq, 1, 0.0, NodeCleared(f"n{seq}", reason))).SerializeToString()


def test_a_span_round_trips_its_records_in_order():
    records = [raw(seq, "x" * (seq % 7)) for seq in range(41, 1041)] + [raw(1041, "")]
    value = encode_span(41, records)
    assert is_span(value) and not is_pointer(value)
    assert decode_span(value) == (41, records)


def test_no_record_state_or_pointer_reads_as_a_span_and_a_span_is_no_record():
    state = codec.state_to_proto(ClusterState(applied_seq=3)).SerializeToString()
    pointer = split(b"v" * 10, 4)[0].encode()
    assert not any(is_span(value) for value in (raw(1), raw(2**40), state, pointer, b""))
    from google.protobuf.message import DecodeError

    from ftsup.v1 import events_pb2

    with pytest.raises(DecodeError):
        events_pb2.Record.FromString(encode_span(1, [raw(1)]))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (b"FTSUP-SPAN/1 7\n", "malformed span header"),
        (b"FTSUP-SPAN/1 x 1\n", "malformed span header"),
        (b"FTSUP-SPAN/1 " + b"9" * 80, "malformed span header"),
        (b"FTSUP-SPAN/1 0 1\n\0\0\0\0", "first seq 0"),
        (encode_span(5, [raw(5), raw(6)])[:-3], "runs past the value's end"),
        (encode_span(5, [raw(5), raw(6)]) + b"!", "1 bytes after its 2 records"),
        (encode_span(5, [raw(5)]).replace(b"5 1\n", b"5 2\n"), "ends after 1 of 2 records"),
        (b"FTSUP-BLOB/1 {}", "not a span"),
    ],
)
def test_a_malformed_span_is_a_clear_error(value: bytes, match: str):
    with pytest.raises(SpanFormatError, match=match):
        decode_span(value)


def test_an_empty_span_is_refused_when_written():
    with pytest.raises(ValueError, match="records"):
        encode_span(1, [])
