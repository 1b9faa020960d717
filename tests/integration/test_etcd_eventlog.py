"""EtcdLog on a real 3-member etcd cluster: the shared contract, fencing, and member faults.

One cluster per session (tests/conftest.py); every test writes under its own prefix. Faults are
real: members are SIGKILLed, SIGTERMed and SIGSTOPped; the `etcd` fixture heals the cluster after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import aetcd
import pytest

from ftsup.supervisor.core.events import Event, NodeCleared
from ftsup.supervisor.eventlog.api import Deposed, Fenced, LogUnavailable
from ftsup.supervisor.eventlog.etcd import EtcdLog, make_client
from ftsup.supervisor.eventlog.etcd_blobs import POINTER_MAGIC, decode_pointer
from tests.support.async_wait import eventually
from tests.support.etcd_cluster import EtcdCluster
from tests.support.eventlog_contract import CONTRACT

if TYPE_CHECKING:
    from ftsup.harness.sim.fleet import CoreDriver
    from ftsup.supervisor.core.state import ClusterState

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(etcd: EtcdCluster) -> AsyncIterator[aetcd.Client]:
    client = make_client([m.client_url for m in etcd.members], timeout_s=1.0)
    yield client
    await client.close()


def ev(i: int, writer: str = "w") -> NodeCleared:
    return NodeCleared(writer, str(i))


@pytest.mark.parametrize("check", CONTRACT, ids=[c.__name__ for c in CONTRACT])
async def test_etcd_log_honours_the_contract(client, etcd_prefix, check) -> None:
    logs: list[EtcdLog] = []

    async def make() -> EtcdLog:
        log = await EtcdLog.open(client, f"{etcd_prefix}/{len(logs)}", op_timeout_s=3.0)
        logs.append(log)
        return log

    try:
        await check(make)
    finally:
        for log in logs:
            await log.aclose()


async def test_a_reopened_log_sees_records_snapshots_and_compaction(client, etcd_prefix) -> None:
    import dataclasses

    from ftsup.supervisor.core.state import ClusterState

    log = await EtcdLog.open(client, etcd_prefix)
    for i in range(1, 21):
        await log.append([ev(i)], term=1, time_unix_s=float(i))
    await log.save_snapshot(dataclasses.replace(ClusterState(), applied_seq=8))
    await log.save_snapshot(dataclasses.replace(ClusterState(), applied_seq=15))
    assert await log.compact() == 8
    await log.aclose()
    again = await EtcdLog.open(client, etcd_prefix)
    assert (again.first_seq, again.head_seq) == (9, 20)
    assert [r.event for r in again.read(9)] == [ev(i) for i in range(9, 21)]
    assert again.load_snapshot() is not None and again.load_snapshot().applied_seq == 15
    assert (await again.append([ev(21)], term=1, time_unix_s=21.0))[0].seq == 21
    await again.aclose()


async def test_a_deposed_leaders_append_is_fenced(client, etcd_prefix) -> None:
    leader_key = f"{etcd_prefix}/leader"
    await client.put(leader_key.encode(), b"a")
    term_a = (await client.get(leader_key.encode())).create_revision
    a = await EtcdLog.open(client, etcd_prefix, fence_key=leader_key)
    b = await EtcdLog.open(client, etcd_prefix, fence_key=leader_key)
    await a.append([ev(1, "a")], term=term_a, time_unix_s=1.0, expect_seq=0)
    # a loses the key; b takes it (a new key incarnation: a higher create revision = term).
    await client.delete(leader_key.encode())
    await client.put(leader_key.encode(), b"b")
    term_b = (await client.get(leader_key.encode())).create_revision
    assert term_b > term_a
    with pytest.raises(Deposed) as deposed:
        await a.append([ev(2, "a")], term=term_a, time_unix_s=2.0, expect_seq=1)
    assert deposed.value.current_term == term_b and isinstance(deposed.value, Fenced)
    await eventually(lambda: b.head_seq == 1, 5, "b's hot copy has a's record")
    written = await b.append([ev(2, "b")], term=term_b, time_unix_s=3.0, expect_seq=1)
    assert [(r.seq, r.term) for r in written] == [(2, term_b)]
    # Even a writer that believes the old head is fenced by the leader key, not only the head.
    with pytest.raises(Deposed):
        await a.append([ev(3, "a")], term=term_a, time_unix_s=4.0)
    await client.delete(leader_key.encode())
    with pytest.raises(Deposed, match="no leader"):
        await b.append([ev(3, "b")], term=term_b, time_unix_s=5.0)
    assert [(r.event.node_id, r.term) for r in b.read()] == [("a", term_a), ("b", term_b)]
    await a.aclose()
    await b.aclose()


async def test_appends_go_on_while_one_follower_member_is_down(etcd, client, etcd_prefix) -> None:
    log = await EtcdLog.open(client, etcd_prefix)
    await log.append([ev(0)], term=1, time_unix_s=0.0)
    follower = next(m.name for m in etcd.members if m.name != etcd.leader_name())
    etcd.kill(follower)
    started = time.monotonic()
    failed_calls = 0
    for i in range(1, 51):
        # When the client's channel was to the killed member, one call fails (UNAVAILABLE:
        # LogUnavailable, retryable by contract) and the channel moves on to a live member. The
        # retry keeps expect_seq: had the failed call committed, it would be Fenced, not doubled.
        while True:
            try:
                await log.append([ev(i)], term=1, time_unix_s=float(i), expect_seq=i)
                break
            except LogUnavailable:
                failed_calls += 1
                assert failed_calls <= 3, "a lost follower must cost at most a few failed calls"
    assert log.head_seq == 51 and time.monotonic() - started < 5
    assert [r.event for r in log.read(2)] == [ev(i) for i in range(1, 51)], "nothing lost or doubled"
    await log.aclose()


async def test_without_quorum_appends_fail_fast_then_resume_with_nothing_lost_or_doubled(
    etcd, client, etcd_prefix
) -> None:
    log = await EtcdLog.open(client, etcd_prefix, op_timeout_s=1.0)
    acked: list[int] = []
    for i in range(1, 11):
        await log.append([ev(i)], term=1, time_unix_s=float(i), expect_seq=log.head_seq)
        acked.append(i)
    # Two of three down: one SIGSTOPped (silent), one SIGKILLed (refusing).
    leader = etcd.leader_name()
    others = [m.name for m in etcd.members if m.name != leader]
    etcd.pause(leader)
    etcd.kill(others[0])
    unavailable = 0
    started = time.monotonic()
    i = 11
    while unavailable < 3:
        t0 = time.monotonic()
        try:
            await log.append([ev(i)], term=1, time_unix_s=float(i), expect_seq=log.head_seq)
            acked.append(i)  # racing the fault: acknowledged before quorum was gone
            i += 1
        except LogUnavailable:
            unavailable += 1
            assert time.monotonic() - t0 < 1.0 + 0.5, "an append hung past its deadline"
        assert time.monotonic() - started < 15
    etcd.resume(leader)
    etcd.restart(others[0])
    # The writer's rule after LogUnavailable (outcome unknown): sync, look, then append again.
    deadline = time.monotonic() + 15
    while i <= 20:
        try:
            await log.sync()
            if [r.event for r in log.read(log.head_seq)] == [ev(i)]:
                acked.append(i)  # the ambiguous append had committed
            else:
                await log.append([ev(i)], term=1, time_unix_s=float(i), expect_seq=log.head_seq)
                acked.append(i)
            i += 1
        except (LogUnavailable, Fenced):
            assert time.monotonic() < deadline, "appends did not resume after quorum came back"
            await asyncio.sleep(0.1)
    await log.sync()
    stored = [int(r.event.reason) for r in log.read()]
    assert stored == acked == list(range(1, 21))
    await log.aclose()


async def test_a_followers_hot_copy_sees_every_record_once_across_an_etcd_leader_restart(
    etcd, etcd_prefix
) -> None:
    leader = etcd.leader_name()
    # The follower reads through the etcd leader member (its stream must break and resume); the
    # writer through another member.
    by_leader_first = sorted(etcd.members, key=lambda m: m.name != leader)
    urls = [m.client_url for m in by_leader_first]
    follower_client, writer_client = make_client(urls), make_client(list(reversed(urls)))
    writer = await EtcdLog.open(writer_client, etcd_prefix)
    follower = await EtcdLog.open(follower_client, etcd_prefix)
    seen: list[int] = []

    async def follow() -> None:
        async for record in follower.follow(1):
            seen.append(record.seq)
            if record.seq == 60:
                return

    reader = asyncio.create_task(follow())
    for i in range(1, 61):
        if i == 20:
            etcd.kill(leader)  # the etcd leader: a raft election, broken streams on its clients
        if i == 40:
            etcd.restart(leader, wait=False)
        while True:
            try:
                await writer.append([ev(i)], term=1, time_unix_s=float(i), expect_seq=i - 1)
                break
            except LogUnavailable:
                await asyncio.sleep(0.05)
            except Fenced:
                break  # the ambiguous attempt had committed
    await asyncio.wait_for(reader, timeout=15)
    assert seen == list(range(1, 61))
    assert follower.watch_restarts >= 1, "the follower's watch never broke: the fault missed it"
    assert [int(r.event.reason) for r in follower.read()] == list(range(1, 61))
    await writer.aclose()
    await follower.aclose()
    await writer_client.close()
    await follower_client.close()


async def test_a_12500_node_fleet_appends_snapshots_and_reopens_within_etcds_request_limits(
    etcd, etcd_prefix
) -> None:
    """12,500 nodes x 8 ranks under the default --max-request-bytes (1.5 MiB) and the client's
    4 MiB response limit: the 12,500 registrations are one append (one span, out of line), the
    GenerationStarted record and the state snapshot are each larger than one request, so all go
    out of line in chunks; a follower's watch and a fresh reader's paged
    reload rebuild the identical state; etcd's history is compacted after the snapshots."""
    from ftsup.harness.sim.fleet import CoreDriver, registered_state
    from ftsup.supervisor.core.config import DetectorConfig, JobSpec
    from ftsup.supervisor.core.events import GenerationStarted
    from ftsup.supervisor.core.inputs import Tick

    nodes = 12_500
    registered = registered_state(nodes, 0, 8)
    driver = CoreDriver(JobSpec(name="big", nodes=nodes, ranks_per_node=8, argv=("train",)), DetectorConfig(),
                        registered)
    started = driver.feed(Tick(), 0.0)
    big = [e for e in started if isinstance(e, GenerationStarted)]
    assert big, "the core started no generation"

    # Its own client: the fixture's allows 1 s per call, and a megabyte's chunks written while the
    # follower reads others over the same connection take longer on a loaded 2-core CI machine.
    roomy = make_client([m.client_url for m in etcd.members], timeout_s=10.0)
    try:
        await _twelve_and_a_half_thousand_nodes(roomy, etcd, etcd_prefix, registered, driver, started)
    finally:
        await roomy.close()


async def _twelve_and_a_half_thousand_nodes(roomy: aetcd.Client, etcd: EtcdCluster, etcd_prefix: str,
                                            registered: ClusterState, driver: CoreDriver,
                                            started: list[Event]) -> None:
    from ftsup.supervisor.core.events import NodeRegistered

    nodes = len(registered.nodes)
    leader = await EtcdLog.open(roomy, etcd_prefix, op_timeout_s=10.0)
    follower = await EtcdLog.open(roomy, etcd_prefix, op_timeout_s=10.0)
    try:
        joins = [NodeRegistered(n.node_id, n.incarnation, n.role, n.host, n.peer_port, n.gpus)
                 for n in registered.nodes.values()]
        await leader.append(joins, term=1, time_unix_s=1.0)  # one transaction: a span, out of line
        span = await roomy.get(f"{etcd_prefix}/log/{nodes:020d}".encode())
        assert span is not None and span.value.startswith(POINTER_MAGIC)
        await leader.save_snapshot(registered)  # the first snapshot: nothing to rotate yet
        await leader.append(list(started), term=1, time_unix_s=2.0)
        assert leader.head_seq == driver.state.applied_seq
        stored = await roomy.get(f"{etcd_prefix}/log/{nodes + 1:020d}".encode())
        assert stored is not None and stored.value.startswith(POINTER_MAGIC), "the big record went out of line"
        await leader.save_snapshot(driver.state)  # chunked; the registered one becomes prev
        pointer = await roomy.get(f"{etcd_prefix}/snapshot".encode())
        assert pointer is not None and pointer.value.startswith(POINTER_MAGIC)
        snapshot = decode_pointer(pointer.value)
        # The GenerationStarted record is 1.3 MiB with these short names (the review's 2.4 MiB had
        # real host names): over what one transaction carries; the snapshot is over 1.5 MiB alone.
        assert snapshot.size > 1_572_864 and snapshot.chunks >= 3
        await leader.append([ev(1)], term=1, time_unix_s=3.0)
        assert await leader.compact() == nodes  # what the older snapshot covers
        assert leader.compacted_revision > 0, "etcd's revision history was not compacted"

        fresh_client = make_client([m.client_url for m in etcd.members], timeout_s=10.0)
        try:
            fresh = await EtcdLog.open(fresh_client, etcd_prefix, op_timeout_s=10.0)
            assert fresh.load_snapshot() == driver.state
            assert [r.event for r in fresh.read(driver.state.applied_seq + 1)] == [ev(1)]
            assert [r.event for r in fresh.read(nodes + 1)][: len(started)] == list(started)
            await fresh.aclose()
        finally:
            await fresh_client.close()
        await eventually(lambda: follower.head_seq == leader.head_seq, 20.0, "the follower caught up")
        assert follower.load_snapshot() == driver.state
        assert list(follower.read(nodes + 1)) == list(leader.read(nodes + 1))
    finally:
        await leader.aclose()
        await follower.aclose()
