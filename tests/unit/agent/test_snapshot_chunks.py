"""common/chunks.py: cutting a payload into chunks and putting it back, pure and in milliseconds."""

from __future__ import annotations

import hashlib
import mmap
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftsup.common.chunks import (
    Assembly,
    HashMismatch,
    InvalidSnapshot,
    OversizedStream,
    SizeMismatch,
    TruncatedStream,
    cut,
    cut_parts,
    spans,
    stream_deadline_s,
)

CHUNK = 8
LIMIT = 1 << 20


def round_trip(payload: bytes, chunk_bytes: int = CHUNK) -> tuple[bytes, list[tuple[bytes, str]]]:
    pieces = [(bytes(piece), sha) for piece, sha in cut(payload, chunk_bytes)]
    assembly = Assembly("snapshot under test", len(payload), LIMIT)
    for piece, _sha in pieces:
        assembly.add(piece)
    return bytes(assembly.finish(pieces[-1][1])), pieces


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, [(0, 0)]),                                 # empty payload: one empty chunk (first and last)
        (CHUNK, [(0, CHUNK)]),                         # exactly one chunk
        (3 * CHUNK, [(0, 8), (8, 16), (16, 24)]),      # many chunks, the last full
        (2 * CHUNK + 3, [(0, 8), (8, 16), (16, 19)]),  # the last chunk partial
        (1, [(0, 1)]),
    ],
)
def test_spans_cover_the_payload_in_order_with_a_chunk_even_for_an_empty_payload(size, expected):
    assert spans(size, CHUNK) == expected


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 5])
def test_cut_then_assemble_gives_back_the_payload_and_only_the_last_chunk_carries_its_sha256(size):
    payload = bytes(range(256))[:size] if size <= 256 else bytes(size)
    back, pieces = round_trip(payload)
    assert back == payload
    assert [sha for _piece, sha in pieces[:-1]] == [""] * (len(pieces) - 1)
    assert pieces[-1][1] == hashlib.sha256(payload).hexdigest()
    assert all(len(piece) <= CHUNK for piece, _sha in pieces)


@given(payload=st.binary(max_size=300), chunk_bytes=st.integers(min_value=1, max_value=64))
def test_any_payload_survives_any_chunking(payload, chunk_bytes):
    back, pieces = round_trip(payload, chunk_bytes)
    assert back == payload
    assert len(pieces) == max(1, -(-len(payload) // chunk_bytes))


def test_cut_slices_are_views_not_copies():
    payload = bytearray(b"a" * (2 * CHUNK))
    first, _ = next(cut(payload, CHUNK))
    payload[0] = ord("b")
    assert first[0] == ord("b")


def test_bytes_beyond_the_declared_size_are_refused_as_oversized():
    assembly = Assembly("snapshot of rank 3 step 7", 10, LIMIT)
    assembly.add(b"x" * 8)
    with pytest.raises(OversizedStream, match="rank 3 step 7: stream carries more than the declared 10 bytes"):
        assembly.add(b"x" * 3)


def test_a_declared_size_over_the_limit_is_refused_before_anything_is_allocated():
    with pytest.raises(OversizedStream, match="declared size 2000000000000 bytes is over the limit of 1024 bytes"):
        Assembly("snapshot", 2_000_000_000_000, 1024)


def test_a_stream_closed_short_of_its_declared_size_is_a_size_mismatch():
    assembly = Assembly("snapshot", 10, LIMIT)
    assembly.add(b"x" * 4)
    with pytest.raises(SizeMismatch, match="closed after 4 of the declared 10 bytes"):
        assembly.finish(hashlib.sha256(b"x" * 4).hexdigest())


def test_a_stream_that_ended_without_its_last_chunk_is_truncated():
    assembly = Assembly("snapshot", 10, LIMIT)
    assembly.add(b"x" * 10)
    error = assembly.truncated()
    assert isinstance(error, TruncatedStream) and isinstance(error, InvalidSnapshot)
    assert "ended after 10 of the declared 10 bytes, without its last chunk" in str(error)


@pytest.mark.parametrize(
    ("claimed", "match"),
    [("0" * 64, "sha256 mismatch \\(claimed 0{64}, payload has [0-9a-f]{64}\\)"), ("abc", "is not 64 hex digits")],
)
def test_a_wrong_or_malformed_sha256_is_a_hash_mismatch(claimed, match):
    assembly = Assembly("snapshot", 3, LIMIT)
    assembly.add(b"abc")
    with pytest.raises(HashMismatch, match=match):
        assembly.finish(claimed)


def test_an_upper_case_sha256_is_accepted_and_the_payload_is_a_read_only_view():
    assembly = Assembly("snapshot", 3, LIMIT)
    assembly.add(b"abc")
    payload = assembly.finish(hashlib.sha256(b"abc").hexdigest().upper())
    assert payload == b"abc" and payload.readonly


def test_followers_see_only_bytes_that_arrived():
    assembly = Assembly("snapshot", 10, LIMIT)
    assembly.add(b"0123")
    assert assembly.view(1, 4) == b"123"
    with pytest.raises(ValueError, match="not received yet"):
        assembly.view(0, 5)


def test_stream_deadlines_grow_with_the_size():
    assert stream_deadline_s(0) == 60.0
    assert 110 < stream_deadline_s(500_000_000) < 130


@given(parts=st.lists(st.binary(max_size=40), max_size=6), chunk_bytes=st.integers(min_value=1, max_value=32))
def test_a_payload_kept_in_parts_is_cut_as_the_joined_payload_would_be(parts, chunk_bytes):
    joined = b"".join(parts)
    cut_up = list(cut_parts(parts, chunk_bytes))
    assert [b"".join(pieces) for pieces in cut_up] == [bytes(piece) for piece, _sha in cut(joined, chunk_bytes)]
    assert all(len(piece) for pieces in cut_up for piece in pieces)  # no empty slices go out


def test_cut_parts_slices_are_views_not_copies():
    first, second = bytearray(b"a" * 6), bytearray(b"b" * 6)
    pieces = next(cut_parts([first, second], CHUNK))
    first[0], second[0] = ord("x"), ord("y")
    assert [bytes(p) for p in pieces] == [b"xaaaaa", b"yb"]


def test_hashing_later_on_another_thread_gives_the_same_verdicts():
    payload = bytes(range(256)) * 100
    sha = hashlib.sha256(payload).hexdigest()
    assembly = Assembly("snapshot", len(payload), LIMIT, hash_later=True)
    assembly.add(payload[:10_000])
    assert assembly.hashed_bytes == 0  # add() only copies
    worker = threading.Thread(target=assembly.hash_received)
    worker.start()
    assembly.add(payload[10_000:])  # lands while the worker hashes what came before
    worker.join()
    assert assembly.hashed_bytes in (10_000, len(payload))
    assert assembly.finish(sha) == payload  # finish hashes whatever the worker left
    assert assembly.hashed_bytes == len(payload)

    corrupt = Assembly("snapshot", len(payload), LIMIT, hash_later=True)
    corrupt.add(payload[:-1] + b"!")
    corrupt.hash_received()
    with pytest.raises(HashMismatch, match="sha256 mismatch"):
        corrupt.finish(sha)


def test_an_abandoned_assembly_stops_hashing_and_is_never_finished():
    assembly = Assembly("snapshot", 3, LIMIT, hash_later=True)
    assembly.add(b"abc")
    assembly.abandon()
    assembly.hash_received()
    assert assembly.hashed_bytes == 0
    with pytest.raises(InvalidSnapshot, match="abandoned"):
        assembly.finish(hashlib.sha256(b"abc").hexdigest())


def test_an_abandoned_assembly_lets_its_buffer_go_at_once_and_takes_no_more_bytes():
    buffer = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    assembly = Assembly("snapshot", 4096, LIMIT, hash_later=True, buffer=buffer)
    assembly.add(b"x" * 100)
    with pytest.raises(BufferError):
        buffer.resize(2048)  # viewed: nobody may reuse it
    assembly.abandon()
    buffer.resize(2048)  # the assembly still lives, and the buffer is free for the next snapshot
    with pytest.raises(InvalidSnapshot, match="abandoned"):
        assembly.add(b"y")
    with pytest.raises(InvalidSnapshot, match="abandoned"):
        assembly.view(0, 10)


def test_a_slice_still_read_keeps_an_abandoned_buffer_from_reuse():
    buffer = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    assembly = Assembly("snapshot", 4096, LIMIT, hash_later=True, buffer=buffer)
    assembly.add(b"abc" * 10)
    follower = assembly.view(0, 30)  # a follower forwarding what arrived
    assembly.abandon()
    with pytest.raises(BufferError):
        buffer.resize(2048)
    assert bytes(follower[:3]) == b"abc"  # unchanged under its reader
    follower.release()
    buffer.resize(2048)


def test_an_assembly_abandoned_while_its_worker_hashes_is_let_go_by_the_worker():
    buffer = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    assembly = Assembly("snapshot", 1 << 20, LIMIT, hash_later=True, buffer=buffer)
    assembly.add(bytes(1 << 20))
    assembly._hashing.acquire()  # a worker in the middle of hash_received
    worker = threading.Thread(target=assembly.hash_received)
    worker.start()
    assembly.abandon()  # cannot release the view under the worker: leaves it to the worker
    with pytest.raises(BufferError):
        buffer.resize(4096)
    assembly._hashing.release()
    worker.join(timeout=10)
    assert not worker.is_alive()
    buffer.resize(4096)
