"""common/chunk_wire.py: SnapshotChunk's wire bytes without protobuf's copies, byte-identical to protobuf's."""

from __future__ import annotations

import hashlib

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from ftsup.common import chunk_wire
from ftsup.common.chunk_wire import Chunk, as_chunk, decode, encode
from ftsup.v1 import peer_pb2, peer_pb2_grpc

headers = st.one_of(st.none(), st.builds(
    peer_pb2.SnapshotHeader, generation=st.integers(0, 2**64 - 1), rank=st.integers(0, 2**32 - 1),
    step=st.integers(0, 2**64 - 1), owner_node_id=st.text(max_size=20), size_bytes=st.integers(0, 2**40)))
shas = st.one_of(st.just(""), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))


def generated(header: peer_pb2.SnapshotHeader | None, data: bytes, sha256: str) -> peer_pb2.SnapshotChunk:
    message = peer_pb2.SnapshotChunk(data=data, sha256=sha256)
    if header is not None:
        message.header.CopyFrom(header)
    return message


@given(header=headers, data=st.binary(max_size=300), sha256=shas, cuts=st.lists(st.integers(0, 300), max_size=4))
def test_encode_writes_the_bytes_protobuf_writes_and_decode_reads_them_back(header, data, sha256, cuts):
    expected = generated(header, data, sha256).SerializeToString()
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    pieces = tuple(memoryview(data)[a:b] for a, b in zip(bounds, bounds[1:], strict=False))  # data in several buffers
    assert encode(Chunk(header, data, sha256)) == expected
    assert encode(Chunk(header, pieces, sha256)) == expected
    decoded = decode(expected)
    assert (decoded.header, bytes(decoded.data), decoded.sha256) == (header, data, sha256)
    assert as_chunk(peer_pb2.SnapshotChunk.FromString(expected)) == Chunk(header, data, sha256)


def test_decode_hands_out_a_view_of_the_message_not_a_copy():
    raw = generated(None, b"x" * 1000, "").SerializeToString()
    data = decode(raw).data
    assert isinstance(data, memoryview) and data.obj is raw


def test_decode_parses_as_protobuf_does_fields_out_of_order_repeated_and_unknown():
    head = peer_pb2.SnapshotHeader(rank=3, step=7, size_bytes=5)
    # sha256 first, data twice (the last wins), the header in two parts (merged), an unknown
    # varint field 9 and an unknown fixed32 field 10 (skipped): what a newer sender could write.
    raw = (generated(None, b"", "ab").SerializeToString() + generated(None, b"old", "").SerializeToString()
           + peer_pb2.SnapshotChunk(header=peer_pb2.SnapshotHeader(rank=3)).SerializeToString()
           + b"\x48\x96\x01" + b"\x55\x01\x02\x03\x04"
           + peer_pb2.SnapshotChunk(header=peer_pb2.SnapshotHeader(step=7, size_bytes=5)).SerializeToString()
           + generated(None, b"hello", "").SerializeToString())
    reference = peer_pb2.SnapshotChunk.FromString(raw)
    decoded = decode(raw)
    assert decoded == as_chunk(reference)
    assert (decoded.header, bytes(decoded.data), decoded.sha256) == (head, b"hello", "ab")


@pytest.mark.parametrize("raw", [
    b"\x12\x05abc",  # data runs past the message
    b"\x12",  # a length that never comes
    b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a varint longer than 10 bytes
    b"\x1a\x02\xff\xfe",  # sha256 that is not UTF-8
    b"\x0b",  # a group (wire type 3)
    b"\x02\x00",  # field number 0
    b"\x0a\x02\x08",  # a header that is not a SnapshotHeader
], ids=["overrun", "no-length", "long-varint", "not-utf8", "group", "field-0", "bad-header"])
def test_malformed_messages_raise_decode_error(raw):
    with pytest.raises(DecodeError):
        decode(raw)


def test_add_servicer_gives_only_the_snapshot_streams_the_codec():
    class Recorder:
        def add_generic_rpc_handlers(self, handlers):
            self.generic = handlers

        def add_registered_method_handlers(self, service, handlers):
            self.service, self.handlers = service, handlers

    server = Recorder()
    chunk_wire.add_servicer(peer_pb2_grpc.add_TrainerLinkServicer_to_server, peer_pb2_grpc.TrainerLinkServicer(),
                            server)
    handlers = server.handlers
    assert server.service == "ftsup.v1.TrainerLink"
    assert handlers["PutSnapshot"].request_deserializer is decode
    assert handlers["PutSnapshot"].response_serializer == peer_pb2.LinkAck.SerializeToString
    assert handlers["GetRestore"].response_serializer is encode
    assert handlers["GetRestore"].request_deserializer == peer_pb2.GetRestoreRequest.FromString
    assert handlers["ReportStep"].request_deserializer != decode  # every other method keeps protobuf's
    assert isinstance(server.generic[0], grpc.GenericRpcHandler)


def test_an_encoded_chunk_carries_the_payload_sha256_like_any_other():
    payload = b"payload" * 100
    sha = hashlib.sha256(payload).hexdigest()
    assert decode(encode(Chunk(None, payload, sha))).sha256 == sha
    assert Chunk(None, (payload[:10], memoryview(payload)[10:]), sha).size == len(payload)
