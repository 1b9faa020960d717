"""Leader election on a real 3-member etcd: one winner, takeover within TTL + margin at a higher
term, and a paused (SIGSTOPped) leader whose lease expired cannot append (it is fenced)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import aetcd
import pytest

from ftsup.harness import orphan_guard
from ftsup.supervisor.core.events import NodeCleared
from ftsup.supervisor.eventlog.etcd import EtcdLog, make_client
from ftsup.supervisor.leader import LeaderElection
from tests.support.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
TTL_S = 2
MARGIN_S = 1.0
# etcd raises a lease's TTL to its minimum, 1.5 x the election timeout rounded up (2 s at the
# default 1 s), and revokes expired leases on a 0.5 s sweep: a stall meant to outlive a lease
# lasts twice its real lifetime. (2.5 s against a 1 s TTL that was really 2 s failed once under
# two busy loops: the lease was not yet revoked when the rival campaigned.)
ETCD_MIN_TTL_S = 2
STALL_S = 2 * ETCD_MIN_TTL_S + 0.5


@pytest.fixture
async def clients(etcd: EtcdCluster) -> AsyncIterator[list[aetcd.Client]]:
    made = [make_client([m.client_url for m in etcd.members]) for _ in range(2)]
    yield made
    for client in made:
        await client.close()


async def test_one_of_two_candidates_wins_and_the_other_sees_it(clients, etcd_prefix) -> None:
    a = LeaderElection(clients[0], etcd_prefix, "a:1", ttl_s=TTL_S)
    b = LeaderElection(clients[1], etcd_prefix, "b:1", ttl_s=TTL_S)
    results = await asyncio.gather(a.campaign(), b.campaign())
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    winner = winners[0]
    assert await a.current() == await b.current() == winner
    loser = b if winner.address == "a:1" else a
    assert not loser.is_leader and (a if loser is b else b).is_leader
    await a.resign()
    await b.resign()
    assert await a.current() is None


async def test_when_the_leaders_client_dies_the_other_takes_over_within_ttl_at_a_higher_term(
    clients, etcd_prefix
) -> None:
    a = LeaderElection(clients[0], etcd_prefix, "a:1", ttl_s=TTL_S)
    b = LeaderElection(clients[1], etcd_prefix, "b:1", ttl_s=TTL_S)
    first = await a.run_until_leader()
    waiting = asyncio.create_task(b.run_until_leader())
    await asyncio.sleep(TTL_S)  # a keeps its lease alive for a whole TTL and more
    assert not waiting.done() and a.is_leader
    killed_at = time.monotonic()
    await clients[0].close()  # no more keepalives: the lease runs out on the server
    if a._keepalive is not None:
        a._keepalive.cancel()
    second = await asyncio.wait_for(waiting, TTL_S + MARGIN_S + 1)
    took = time.monotonic() - killed_at
    assert second.address == "b:1" and second.term > first.term
    assert took <= TTL_S + MARGIN_S, f"takeover took {took:.2f}s"
    assert await b.current() == second
    await b.resign()


async def test_a_paused_leader_is_fenced_after_its_lease_expired(etcd, clients, etcd_prefix) -> None:
    endpoints = ",".join(f"127.0.0.1:{m.client_port}" for m in etcd.members)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.leader_candidate", endpoints, etcd_prefix, "paused:1"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
    )  # fmt: skip
    orphan_guard.watch(proc)  # stopped even if pytest itself is killed
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
        assert line.startswith("LEADER"), line
        old_term = int(line.split()[1])
        proc.send_signal(signal.SIGSTOP)
        paused_at = time.monotonic()
        me = LeaderElection(clients[0], etcd_prefix, "new:1", ttl_s=TTL_S)
        mine = await asyncio.wait_for(me.run_until_leader(), TTL_S + MARGIN_S + 1)
        assert mine.term > old_term and time.monotonic() - paused_at <= TTL_S + MARGIN_S
        log = await EtcdLog.open(clients[0], etcd_prefix, fence_key=me.key)
        await log.append([NodeCleared("new:1", "took over")], term=mine.term, time_unix_s=time.time())
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write("append\n")
        proc.stdin.flush()
        answers = []
        while not answers or answers[-1] == "LOST":
            answers.append((await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 10)).strip())
        assert answers[-1] == "FENCED", answers
        await log.sync()
        # The log: the old leader's record, then only the new term's (nothing of the old term after).
        assert [(r.term, r.event.reason) for r in log.read()] == [(old_term, "won"), (mine.term, "took over")]
        await log.aclose()
        await me.resign()
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.parametrize("in_a_thread", [True, False], ids=["keepalive-thread", "keepalive-on-the-loop"])
async def test_a_leader_whose_event_loop_stalls_past_the_ttl_keeps_its_lease_only_with_the_keepalive_thread(
    clients, etcd, etcd_prefix, in_a_thread
) -> None:
    """A generation start for 12,500 nodes blocks the leader's loop for seconds: with its refresh
    on a thread of its own the lease holds (and nobody else may take over); on the loop, it lapses."""
    from ftsup.supervisor.etcd_tls import sync_channel_factory

    channel = sync_channel_factory([m.client_url.removeprefix("http://") for m in etcd.members]) if in_a_thread else None
    a = LeaderElection(clients[0], etcd_prefix, "a:1", ttl_s=1, keepalive_channel=channel)
    b = LeaderElection(clients[1], etcd_prefix, "b:1", ttl_s=1)
    first = await a.run_until_leader()
    time.sleep(STALL_S)  # noqa: ASYNC251 (the point: the loop runs nothing for two lease lifetimes, as in a stall)
    await asyncio.sleep(0)  # (what the keepalive thread reported meanwhile runs now)
    rival = await b.campaign()
    try:
        if in_a_thread:
            assert rival is None and a.is_leader and not a.lost.is_set()
            assert await b.current() == first
        else:
            assert rival is not None and not a.is_leader, "the loop's own keepalive cannot outlive a stall"
    finally:
        await a.resign()
        await b.resign()



async def test_a_leader_whose_loop_is_wedged_for_good_lets_its_lease_lapse_despite_the_keepalive_thread(
    clients, etcd, etcd_prefix
) -> None:
    """The thread keeps the lease through a stall, but not through a loop that stopped running for
    longer than any stall is forgiven: a rival then takes over within the lease's lifetime."""
    from ftsup.supervisor.etcd_tls import sync_channel_factory

    channel = sync_channel_factory([m.client_url.removeprefix("http://") for m in etcd.members])
    a = LeaderElection(clients[0], etcd_prefix, "a:1", ttl_s=1, keepalive_channel=channel, max_loop_stall_s=1.0)
    b = LeaderElection(clients[1], etcd_prefix, "b:1", ttl_s=1)
    await a.run_until_leader()
    time.sleep(1.0 + STALL_S)  # noqa: ASYNC251 (the point: the loop runs nothing past its allowance)
    await asyncio.sleep(0)  # (the thread's report of the loss runs now)
    try:
        rival = await b.campaign()
        assert rival is not None and rival.address == "b:1" and not a.is_leader and a.lost.is_set()
    finally:
        await a.resign()
        await b.resign()


@pytest.mark.parametrize("in_a_thread", [True, False], ids=["keepalive-thread", "keepalive-on-the-loop"])
async def test_a_follower_shards_membership_key_outlives_a_loop_stall_only_with_the_keepalive_thread(
    clients, etcd, etcd_prefix, in_a_thread
) -> None:
    """A shard's loop stalls under its agents' load: with the refresh on a thread its membership
    key stays (the same key, never deleted and put again), so no replica re-spreads the fleet."""
    from ftsup.supervisor.etcd_tls import sync_channel_factory
    from ftsup.supervisor.shard_members import ReplicaMembers, members_prefix

    channel = sync_channel_factory([m.client_url.removeprefix("http://") for m in etcd.members]) if in_a_thread else None
    members = ReplicaMembers(clients[0], etcd_prefix, "a:1", ttl_s=1, keepalive_channel=channel)
    key = members_prefix(etcd_prefix) + b"a:1"
    runner = asyncio.create_task(members.run())
    try:
        deadline = time.monotonic() + 10
        while (before := await clients[1].get(key)) is None:
            assert time.monotonic() < deadline, "the membership key was never put"
            await asyncio.sleep(0.05)
        time.sleep(STALL_S)  # noqa: ASYNC251 (the point: the loop runs nothing for two lease lifetimes)
        # The lease's remaining life as etcd's leader computes it, read first: negative (or -1,
        # revoked) once it expired, whether or not etcd's lessor has revoked it yet. A loaded etcd
        # revokes late: the key itself was still there 4.5 s into a stall under two busy loops.
        remaining_s = (await asyncio.wait_for(clients[1].get_lease_info(before.lease, keys=False), 5)).TTL
        after = await asyncio.wait_for(clients[1].get(key), 5)  # (before run() goes round again)
        if in_a_thread:
            assert after is not None and after.create_revision == before.create_revision
            assert remaining_s > 0, f"the thread kept the lease alive: {remaining_s} s left"
        else:
            assert remaining_s <= 0 or after is None or after.create_revision != before.create_revision, (
                f"the loop's refresh cannot outlive a stall: {remaining_s} s left")
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
    assert await clients[1].get(key) is None, "a replica on its way out revokes its key"
