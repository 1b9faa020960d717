"""Receive buffers reused (issue 18): a dropped snapshot's buffer takes the next snapshot of its rank.

Copying a snapshot into a fresh mapping faults in every page; a buffer retention dropped is
resident already. Covered: the next snapshot of a rank lands in its spare (also through the real
trainer -> agent -> buddy endpoints), a spare fits sizes within 1/SPARE_FIT either way and is cut
to the size, a buffer anyone still views (a blob kept from `get`, a slice of it, a pinned fetch)
is never written into, spares count against the memory limit and give way before a snapshot is
refused, a discarded or cancelled snapshot gives its buffer back, and the bytes a reused buffer
still holds never reach a new payload (size and SHA-256 are checked over the bytes received).
"""

from __future__ import annotations

import asyncio
import hashlib
import random

import pytest

from ftsup.agent.core.retention import KEEP_STEPS_PER_RANK
from ftsup.agent.snapshots import SPARE_FIT, SnapshotId, SnapshotMemoryFull, SnapshotStore
from ftsup.agent.streams import receive
from ftsup.common.chunk_wire import Chunk
from ftsup.common.chunks import SizeMismatch
from tests.unit.agent.test_snapshot_streams import Node, client, header

SIZE = 256 * 1024 + 17


@pytest.fixture
async def pair():
    """An agent and its buddy on loopback (test_snapshot_streams' endpoints), rank 0's copies on b."""
    a, b = await Node("a").start(), await Node("b").start()
    a.run.buddy_address, a.run.buddy_node_id = b.address, "b"
    b.run.ranks = (1,)
    b.grant(stores={"a": {0}})
    yield a, b
    await a.stop()
    await b.stop()


def payload(step: int, size: int = SIZE) -> bytes:
    return random.Random(step).randbytes(size)


def ident(rank: int, step: int) -> SnapshotId:
    return SnapshotId(1, rank, step, "n1")


def land(store: SnapshotStore, rank: int, step: int, size: int = SIZE) -> None:
    """Receives `payload(step, size)` as rank's snapshot `step` (keeps no reference to the blob)."""
    data = payload(step, size)
    incoming = store.receive(ident(rank, step), size)
    incoming.add(data[:size // 3])
    incoming.add(data[size // 3:])
    incoming.finish(hashlib.sha256(data).hexdigest())


def holds_exactly_what_was_sent(store: SnapshotStore) -> bool:
    for rank, step in store.keys():
        blob = store.get(rank, step)
        assert blob is not None
        data = payload(step, blob.size_bytes)
        if bytes(blob.payload) != data or blob.sha256 != hashlib.sha256(data).hexdigest():
            return False
    return True


def within_limit(store: SnapshotStore) -> bool:
    return store.bytes_held + store.bytes_incoming + store.bytes_spare <= store.memory_limit_bytes


def test_the_buffer_retention_drops_takes_the_next_snapshot_of_its_rank():
    store = SnapshotStore(ram_bytes=1 << 34)
    for step in range(1, KEEP_STEPS_PER_RANK + 2):  # the last one arrives before it drops step 1
        land(store, 0, step)
    assert store.buffers_reused == 0 and store.bytes_spare == SIZE  # step 1's buffer
    for step in range(KEEP_STEPS_PER_RANK + 2, 20):
        land(store, 0, step)
        assert store.bytes_spare == SIZE and within_limit(store)
    assert store.buffers_reused == 20 - KEEP_STEPS_PER_RANK - 2
    assert len(store) == KEEP_STEPS_PER_RANK and store.bytes_held == KEEP_STEPS_PER_RANK * SIZE
    assert holds_exactly_what_was_sent(store)


@pytest.mark.parametrize("size, reused", [
    (SIZE, True),
    (SIZE - SIZE // (SPARE_FIT + 1), True),  # a smaller snapshot: the spare is cut to its size
    (SIZE + SIZE // SPARE_FIT, True),  # a larger one: grown by pages never touched
    (SIZE - SIZE // (SPARE_FIT - 1), False),  # too far off either way: a fresh buffer
    (SIZE + SIZE // (SPARE_FIT - 2), False),
])
def test_a_spare_fits_a_size_within_an_eighth_either_way_and_is_resized_to_it(size, reused):
    store = SnapshotStore(keep_per_rank=1, ram_bytes=1 << 34)
    land(store, 0, 1)
    land(store, 0, 2)  # drops step 1: its buffer is the spare
    land(store, 0, 3, size)
    assert store.buffers_reused == int(reused)
    blob = store.get(0, 3)
    assert blob is not None and blob.size_bytes == size and bytes(blob.payload) == payload(3, size)
    assert store.bytes_held == size and store.bytes_spare == SIZE  # step 2's buffer now
    del blob
    land(store, 0, 4, size)  # the spare of step 2 is within the rule exactly when step 3's size was
    assert store.buffers_reused == 2 * int(reused) and holds_exactly_what_was_sent(store)


def test_a_blob_someone_kept_is_never_written_into_even_after_retention_dropped_it():
    store = SnapshotStore(keep_per_rank=1, ram_bytes=1 << 34)
    land(store, 0, 1)
    kept = store.get(0, 1)  # e.g. the SDC check writing it to a file, unpinned
    assert kept is not None
    piece = memoryview(kept.payload)[100:200]
    land(store, 0, 2)  # drops step 1: a spare, but `kept` still reads it
    del kept
    land(store, 0, 3)  # the slice alone still exports a view of the buffer: a fresh one
    assert store.buffers_reused == 0 and bytes(piece) == payload(1)[100:200]
    del piece
    land(store, 0, 4)  # step 2's buffer (nobody reads it) is the spare now
    assert store.buffers_reused == 1 and holds_exactly_what_was_sent(store)


def test_a_blob_read_while_retention_drops_it_stays_counted_and_becomes_a_spare_after():
    store = SnapshotStore(keep_per_rank=1, ram_bytes=1 << 34)
    land(store, 0, 1)
    with store.reading(0, 1) as fetched:  # a FetchSnapshot streaming it out
        assert fetched is not None
        land(store, 0, 2)  # dropped while read: pinned, counted as held, not a spare
        assert store.bytes_held == 2 * SIZE and store.bytes_pinned == SIZE and store.bytes_spare == 0
        land(store, 0, 3)  # drops step 2 (not read): that one is the spare, step 1 is still read
        assert store.buffers_reused == 0 and bytes(fetched.payload) == payload(1)
        assert store.bytes_spare == SIZE
        land(store, 0, 4)  # takes step 2's buffer; step 3's becomes the spare
        assert store.buffers_reused == 1 and bytes(fetched.payload) == payload(1)
    assert store.bytes_pinned == 0 and store.bytes_held == SIZE and store.bytes_spare == SIZE  # one per rank
    del fetched
    assert within_limit(store) and holds_exactly_what_was_sent(store)


def test_spares_count_against_the_limit_and_give_way_before_a_snapshot_is_refused():
    store = SnapshotStore(keep_per_rank=1, memory_limit_bytes=3 * SIZE, ram_bytes=1 << 34)
    land(store, 0, 1)
    land(store, 0, 2)
    assert store.bytes_held == SIZE and store.bytes_spare == SIZE
    # 2x the size: no spare fits it; it fits only once the spare is let go, and that is what happens
    incoming = store.receive(ident(1, 1), 2 * SIZE)
    assert store.bytes_spare == 0 and store.bytes_held + store.bytes_incoming == 3 * SIZE
    with pytest.raises(SnapshotMemoryFull):
        store.receive(ident(0, 3), SIZE)  # refused for what is held and arriving, not for spares
    incoming.truncated()  # its buffer becomes rank 1's spare, inside the limit
    assert store.bytes_incoming == 0 and store.bytes_spare == 2 * SIZE and within_limit(store)


def test_retiring_ranks_and_any_mix_of_sizes_keeps_spares_bounded_and_inside_the_limit():
    rng = random.Random(7)
    store = SnapshotStore(keep_per_rank=2, memory_limit_bytes=9 * SIZE, ram_bytes=1 << 34)
    store.expect_ranks(frozenset({0, 1, 2}))
    steps = dict.fromkeys(range(3), 0)
    for _ in range(200):
        rank = rng.randrange(3)
        steps[rank] += 1
        size = rng.choice((SIZE, SIZE + 4096, SIZE - 4096, SIZE // 2, 2 * SIZE))
        try:
            incoming = store.receive(ident(rank, steps[rank]), size)
        except SnapshotMemoryFull:
            continue
        data = payload(steps[rank], size)
        incoming.add(data[:size // 2])
        if rng.random() < 0.2:
            incoming.truncated()
        else:
            incoming.add(data[size // 2:])
            incoming.finish(hashlib.sha256(data).hexdigest())
        assert within_limit(store) and len(store._spares) <= 3
    assert store.buffers_reused > 0 and holds_exactly_what_was_sent(store)
    store.expect_ranks(frozenset({0}))
    assert set(store._spares) <= {0}  # no snapshot of ranks 1 and 2 is coming: their spares go


def test_a_discarded_snapshot_gives_its_buffer_back_and_old_bytes_never_reach_a_new_payload():
    store = SnapshotStore(keep_per_rank=1, ram_bytes=1 << 34)
    land(store, 0, 1)
    land(store, 0, 2)
    incoming = store.receive(ident(0, 3), SIZE)  # into step 1's buffer
    incoming.add(payload(3)[:SIZE // 2])
    incoming.truncated()
    assert store.bytes_incoming == 0 and store.bytes_spare == SIZE and store.buffers_reused == 1
    del incoming
    # The buffer holds step 3's first half and step 1's second half: a stream that sends half and
    # claims the hash of what the buffer holds gets nothing of it.
    stale = payload(3)[:SIZE // 2] + payload(1)[SIZE // 2:]
    incoming = store.receive(ident(0, 4), SIZE)
    assert store.buffers_reused == 2
    incoming.add(payload(3)[:SIZE // 2])
    with pytest.raises(ValueError):
        incoming._assembly.view(0, SIZE // 2 + 1)  # followers never see beyond what arrived
    with pytest.raises(SizeMismatch):
        incoming.finish(hashlib.sha256(stale).hexdigest())
    assert store.get(0, 4) is None and store.bytes_incoming == 0 and store.bytes_spare == SIZE
    # The discarded incoming (and the error it raised) still live: its buffer was let go anyway,
    # not left to a garbage collection of the error's traceback cycle.
    land(store, 0, 5)
    assert store.buffers_reused == 3 and holds_exactly_what_was_sent(store)
    assert incoming.is_ended


async def test_a_cancelled_receive_returns_its_reservation_and_its_buffer():
    store = SnapshotStore(keep_per_rank=1, ram_bytes=1 << 34)
    land(store, 0, 1)
    land(store, 0, 2)
    incoming = store.receive(ident(0, 3), SIZE)
    stalled = asyncio.get_running_loop().create_future()

    async def read() -> object:
        return await stalled  # the sender went quiet

    task = asyncio.create_task(receive(Chunk(None, payload(3)[:1000]), read, incoming))
    await asyncio.sleep(0)
    task.cancel()  # the call's deadline passed: CancelledError is a BaseException
    with pytest.raises(asyncio.CancelledError):
        await task
    assert incoming.is_ended and store.bytes_incoming == 0 and store.bytes_spare == SIZE
    # The cancelled task keeps its CancelledError, whose traceback holds receive's frame and the
    # incoming: its buffer was let go all the same, and step 4 lands in it.
    land(store, 0, 4)
    assert store.buffers_reused == 2 and holds_exactly_what_was_sent(store)
    assert task.cancelled()


async def test_snapshots_streamed_to_an_agent_and_its_buddy_land_in_reused_buffers(pair):
    a, b = pair
    steps = range(1, KEEP_STEPS_PER_RANK + 5)
    for step in steps:
        data = payload(step, 300_000 + step)  # sizes move a little from step to step
        sha = await asyncio.to_thread(client(a).put_snapshot, header(step=step, size=len(data)), data)
        assert sha == hashlib.sha256(data).hexdigest()
    for node in (a, b):
        assert node.store.keys() == [(0, step) for step in steps[-KEEP_STEPS_PER_RANK:]]
        assert holds_exactly_what_was_sent(node.store) and within_limit(node.store)
        # the first KEEP + 1 steps arrive before anything is dropped; each later one reuses a buffer
        assert node.store.buffers_reused == len(steps) - KEEP_STEPS_PER_RANK - 1
