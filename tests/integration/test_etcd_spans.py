"""Appends longer than one etcd transaction has operations for (spans), on the real 3-member etcd.

A Tick that judges a rack lost decides hundreds of events at once; etcd's --max-txn-ops (128 by
default) used to refuse such an append outright, on every tick. Each test writes under its own
prefix of the session's cluster (tests/conftest.py); faults are real (SIGKILLed members).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import aetcd
import pytest

from ftsup.supervisor.core.events import NodeCleared, Record
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.api import Deposed, Fenced, LogUnavailable
from ftsup.supervisor.eventlog.etcd import EtcdLog, make_client
from ftsup.supervisor.eventlog.etcd_blobs import POINTER_MAGIC
from ftsup.supervisor.eventlog.etcd_spans import SPAN_MAGIC
from tests.support.async_wait import eventually
from tests.support.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.integration

# Small chunks so that a few big events take a span out of line, as megabytes would by default.
SMALL = {"op_timeout_s": 5.0, "chunk_bytes": 64 * 1024, "max_txn_bytes": 256 * 1024}


@pytest.fixture
async def client(etcd: EtcdCluster) -> AsyncIterator[aetcd.Client]:
    client = make_client([m.client_url for m in etcd.members], timeout_s=5.0)
    yield client
    await client.close()


def ev(i: int, size: int = 0) -> NodeCleared:
    return NodeCleared(f"node-{i}", f"{i} " + "x" * size)


def batch(first: int, count: int, *, big_every: int = 0) -> list[NodeCleared]:
    """`count` events; every `big_every`-th one ~20 KiB (out of line on its own at SMALL)."""
    return [ev(i, 20_000 if big_every and i % big_every == 0 else 0) for i in range(first, first + count)]


async def log_keys(client: aetcd.Client, prefix: str) -> dict[int, aetcd.KeyValue]:
    root = f"{prefix}/log/".encode()
    return {int(kv.key[len(root):]): kv for kv in await client.get_prefix(root)}


async def test_an_append_of_a_thousand_events_commits_in_one_transaction_and_reads_back_identically(
    client, etcd_prefix
) -> None:
    writer = await EtcdLog.open(client, etcd_prefix, **SMALL)
    follower = await EtcdLog.open(client, etcd_prefix, **SMALL)
    followed: list[Record] = []

    async def follow() -> None:
        async for record in follower.follow(1):
            followed.append(record)
            if record.seq == 2103:
                return

    reader = asyncio.create_task(follow())
    try:
        await writer.append([ev(0)], term=1, time_unix_s=0.0)  # one per key, as before spans
        small = await writer.append(batch(1, 1000), term=1, time_unix_s=1.0)
        assert [r.seq for r in small] == list(range(2, 1002))
        keys = await log_keys(client, etcd_prefix)
        head = await client.get(f"{etcd_prefix}/head".encode())
        assert sorted(keys) == [1, 1001] and keys[1001].value.startswith(SPAN_MAGIC)
        assert keys[1001].mod_revision == head.mod_revision, "the span and the head: one transaction"
        # 1,000 more with big ones among them: the span goes out of line (a pointer to its chunks).
        await writer.append(batch(1001, 1000, big_every=100), term=1, time_unix_s=2.0)
        keys = await log_keys(client, etcd_prefix)
        assert sorted(keys) == [1, 1001, 2001] and keys[2001].value.startswith(POINTER_MAGIC)
        # Back to one key per record for an append that fits a transaction.
        await writer.append(batch(2001, 102), term=1, time_unix_s=3.0)
        assert len(await log_keys(client, etcd_prefix)) == 3 + 102

        expected = list(writer.read())
        assert [r.seq for r in expected] == list(range(1, 2104))
        assert [r.event for r in expected] == [ev(0), *batch(1, 1000), *batch(1001, 1000, big_every=100),
                                               *batch(2001, 102)]
        fresh = await EtcdLog.open(client, etcd_prefix, **SMALL)  # sync: a paged read at one revision
        assert list(fresh.read()) == expected
        await fresh.aclose()
        await asyncio.wait_for(reader, 15)
        assert followed == expected, "the watch delivered every record of each span once, in order"
    finally:
        reader.cancel()
        await writer.aclose()
        await follower.aclose()


async def test_compaction_across_a_span_keeps_the_records_no_snapshot_covers(client, etcd_prefix) -> None:
    writer = await EtcdLog.open(client, etcd_prefix, **SMALL)
    follower = await EtcdLog.open(client, etcd_prefix, **SMALL)
    try:
        await writer.append(batch(1, 10), term=1, time_unix_s=1.0)
        await writer.append(batch(11, 300, big_every=50), term=1, time_unix_s=2.0)  # seqs 11..310
        await writer.append(batch(311, 5), term=1, time_unix_s=3.0)
        await writer.save_snapshot(ClusterState(applied_seq=100))  # inside the span
        await writer.save_snapshot(ClusterState(applied_seq=315))
        assert await writer.compact() == 100
        keys = await log_keys(client, etcd_prefix)
        assert sorted(keys) == [310, 311, 312, 313, 314, 315], "the span holding 101..310 stays"
        assert keys[310].value.startswith(POINTER_MAGIC)
        # Its chunks are referenced: two collections in a row leave them (and read them back).
        await writer.collect_garbage()
        assert await writer.collect_garbage() == 0
        expected = [*batch(101, 210, big_every=50), *batch(311, 5)]
        assert writer.first_seq == 101 and [r.event for r in writer.read(101)] == expected
        await eventually(lambda: follower.first_seq == 101, 10, "the follower saw the compaction")
        assert list(follower.read(101)) == list(writer.read(101))
        fresh = await EtcdLog.open(client, etcd_prefix, **SMALL)
        assert (fresh.first_seq, fresh.head_seq) == (101, 315), "a reader skips what compaction covered"
        assert list(fresh.read(101)) == list(writer.read(101))
        await fresh.aclose()

        # The next compaction covers the whole span: its key and its chunks go.
        await writer.append(batch(316, 1), term=1, time_unix_s=4.0)
        await writer.save_snapshot(ClusterState(applied_seq=316))
        assert await writer.compact() == 215
        assert sorted(await log_keys(client, etcd_prefix)) == [316]
        blobs = await client.get_prefix(f"{etcd_prefix}/blob/".encode())
        assert len(list(blobs)) == 0, "the span's chunks went with it (the snapshots are inline)"
        again = await EtcdLog.open(client, etcd_prefix, **SMALL)
        assert (again.first_seq, again.head_seq) == (316, 316)
        await again.aclose()
    finally:
        await writer.aclose()
        await follower.aclose()


async def test_span_appends_lose_nothing_across_an_etcd_leader_kill_and_a_supervisor_handover(
    etcd, etcd_prefix
) -> None:
    leader_key = f"{etcd_prefix}/leader".encode()
    member = etcd.leader_name()
    urls = [m.client_url for m in sorted(etcd.members, key=lambda m: m.name != member)]
    follower_client, writer_client = make_client(urls, timeout_s=5.0), make_client(list(reversed(urls)),
                                                                                     timeout_s=5.0)
    await writer_client.put(leader_key, b"a")
    term_a = (await writer_client.get(leader_key)).create_revision
    a = await EtcdLog.open(writer_client, etcd_prefix, fence_key=leader_key.decode(), **SMALL)
    follower = await EtcdLog.open(follower_client, etcd_prefix, **SMALL)  # watches through the member
    rounds, per_round = 6, 400
    try:
        for n in range(rounds):
            if n == 2:
                etcd.kill(member)  # the etcd raft leader: an election, the follower's stream breaks
            if n == 4:
                etcd.restart(member, wait=False)
            expect = n * per_round
            events = batch(expect + 1, per_round, big_every=97)
            deadline = time.monotonic() + 20
            while True:
                try:
                    await a.append(events, term=term_a, time_unix_s=float(n), expect_seq=expect)
                    break
                except LogUnavailable:  # outcome unknown: look before appending again
                    assert time.monotonic() < deadline, "appends did not resume after the election"
                    await asyncio.sleep(0.1)
                    with contextlib.suppress(LogUnavailable):
                        await a.sync()
                    if a.head_seq == expect + per_round:
                        break  # the ambiguous append had committed, whole
                    assert a.head_seq == expect, "a span committed in part"
                except Fenced:
                    await a.sync()
                    assert a.head_seq == expect + per_round
                    break
        # A supervisor handover: a's key goes, b takes it. a's next big append leaves nothing.
        await writer_client.delete(leader_key)
        await writer_client.put(leader_key, b"b")
        term_b = (await writer_client.get(leader_key)).create_revision
        head = rounds * per_round
        with pytest.raises(Deposed):
            await a.append(batch(head + 1, per_round), term=term_a, time_unix_s=9.0, expect_seq=head)
        b = await EtcdLog.open(writer_client, etcd_prefix, fence_key=leader_key.decode(), **SMALL)
        assert b.head_seq == head
        await b.append(batch(head + 1, 1000), term=term_b, time_unix_s=10.0, expect_seq=head)
        expected = []
        for n in range(rounds):
            expected.extend(batch(n * per_round + 1, per_round, big_every=97))
        expected.extend(batch(head + 1, 1000))
        await eventually(lambda: follower.head_seq == head + 1000, 20, "the follower caught up")
        assert [r.event for r in follower.read()] == expected
        assert [r.term for r in follower.read()] == [term_a] * head + [term_b] * 1000
        assert list(b.read()) == list(follower.read())
        assert follower.watch_restarts >= 1, "the follower's watch never broke: the fault missed it"
        await b.aclose()
    finally:
        await a.aclose()
        await follower.aclose()
        await writer_client.close()
        await follower_client.close()
