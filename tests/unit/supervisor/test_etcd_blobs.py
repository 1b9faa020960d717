"""The out-of-line value format of the etcd log: pointers, chunks, ranges (pure parts)."""

from __future__ import annotations

import hashlib

import pytest

from ftsup.supervisor import codec
from ftsup.supervisor.core.events import NodeCleared, Record
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.etcd_blobs import (
    chunk_key,
    decode_pointer,
    is_pointer,
    prefix_end,
    split,
)


def test_a_value_splits_into_bounded_chunks_and_a_pointer_that_names_them():
    value = bytes(range(256)) * 41
    pointer, chunks = split(value, 1024)
    assert [len(c) for c in chunks] == [1024] * 10 + [256] and b"".join(chunks) == value
    assert pointer.sha256 == hashlib.sha256(value).hexdigest() and pointer.chunks == 11
    assert decode_pointer(pointer.encode()) == pointer and is_pointer(pointer.encode())


def test_no_record_or_state_proto_reads_as_a_pointer():
    record = codec.record_to_proto(Record(1, 1, 0.0, NodeCleared("n", "r"))).SerializeToString()
    state = codec.state_to_proto(ClusterState(applied_seq=3)).SerializeToString()
    assert not is_pointer(record) and not is_pointer(state)


def test_a_malformed_pointer_is_a_clear_error():
    with pytest.raises(ValueError, match="malformed blob pointer"):
        decode_pointer(b"FTSUP-BLOB/1 {not json")


def test_chunk_keys_sort_in_order_inside_their_blobs_range():
    keys = [chunk_key(b"p/", "ab" * 32, i) for i in (0, 9, 10, 999)]
    assert keys == sorted(keys)
    assert all(b"p/blob/" + b"ab" * 32 + b"/" <= k < prefix_end(b"p/blob/" + b"ab" * 32 + b"/") for k in keys)
