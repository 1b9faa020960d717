"""A link shard keeps its agents' streams across a leader change (issue 14): the relay to the old
leader ends, the shard keeps the streams of agents that resync on a second Welcome and replays
their Hellos to the next leader, which welcomes them through the same stream; an older agent's
stream is ended (it reconnects, as before); the kept streams are ended when this replica is the
one that now leads, or when no relay comes up in time. Real gRPC in process: two leader runtimes
with their relay services, and a follower whose agent service hands its agents to the shard."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from ftsup.common.shard_map import shard_of
from ftsup.supervisor import shard as shard_module
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server.agent_service import AgentService
from ftsup.supervisor.server.relay_service import RelayService
from ftsup.supervisor.shard import LinkShard
from ftsup.supervisor.shard_queue import UpQueue, forwarded
from ftsup.v1 import agent_pb2, agent_pb2_grpc, shard_pb2_grpc
from tests.support.builders import config
from tests.unit.supervisor.test_link_shard import beat, hello_message, kinds, read_until, until, xid


def test_replayed_hellos_go_ahead_of_what_was_queued_and_a_queued_heartbeat_still_folds():
    queue = UpQueue()
    queue.push(forwarded(1, "n1", 1, beat(1)))
    queue.push(forwarded(1, "n1", 1, xid(79)))
    queue.put_first([forwarded(1, "n1", 1, hello_message("n1")), forwarded(2, "n2", 1, hello_message("n2"))])
    queue.push(forwarded(1, "n1", 1, beat(2)))  # folds into its queued heartbeat, now two places later
    assert kinds(queue.take()) == [(1, "hello"), (2, "hello"), (1, "hb2"), (1, "xid_event")]


class Replicas:
    def __init__(self, first: str, second: str, follower: str, runtimes: list[Runtime], shard: LinkShard,
                 leads: list[str], servers: list[grpc.aio.Server]) -> None:
        self.first, self.second, self.follower = first, second, follower
        self.runtimes, self.shard, self.leads, self.servers = runtimes, shard, leads, servers

    def node(self, index: int) -> str:
        """The index-th node id homed on the follower's shard."""
        homed = (f"n{i}" for i in range(1000) if shard_of(f"n{i}", (self.first, self.follower)) == self.follower)
        return next(n for i, n in enumerate(homed) if i == index)


@contextlib.asynccontextmanager
async def replicas() -> AsyncIterator[Replicas]:
    runtimes = [Runtime(config(nodes=2), MemoryLog(), tick_s=0.05) for _ in range(2)]
    follower_runtime = Runtime(config(nodes=2), MemoryLog(), tick_s=0.05)
    follower_runtime.become_follower()
    servers = [grpc.aio.server() for _ in range(3)]
    first, second, follower = (f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}" for server in servers)
    for server, runtime in zip(servers, runtimes, strict=False):
        shard_pb2_grpc.add_LinkShardServicer_to_server(RelayService(runtime), server)
    shard = LinkShard(follower, lambda: (first, follower))
    agent_pb2_grpc.add_SupervisorServicer_to_server(AgentService(follower_runtime, shard=shard), servers[2])
    for server in servers:
        await server.start()
    leads = [first]
    tasks = [*(asyncio.create_task(runtime.run()) for runtime in runtimes),
             asyncio.create_task(shard.relay_forever(lambda: leads[0]))]
    try:
        await until(shard.relay_up.is_set, "the shard's relay to the first leader")
        yield Replicas(first, second, follower, runtimes, shard, leads, servers)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in servers:
            await server.stop(0)


async def connect(channel: grpc.aio.Channel, node: str, resyncs: bool) -> grpc.aio.StreamStreamCall:
    call = agent_pb2_grpc.SupervisorStub(channel).Connect()
    hello = hello_message(node)
    hello.hello.resyncs_on_welcome = resyncs
    await call.write(hello)
    await read_until(call, "welcome")
    return call


@contextlib.asynccontextmanager
async def beating(call: grpc.aio.StreamStreamCall) -> AsyncIterator[None]:
    """The agent heartbeats every 0.2 s meanwhile (a live agent: the shard vouches only for those)."""
    async def beat() -> None:
        seq = 100
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            while True:
                seq += 1
                await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq)))
                await asyncio.sleep(0.2)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def ends(call: grpc.aio.StreamStreamCall) -> None:
    while (message := await asyncio.wait_for(call.read(), 5.0)) is not grpc.aio.EOF:
        assert message.WhichOneof("kind") != "welcome", "welcomed again instead of ended"


async def test_a_resyncing_agents_stream_is_kept_and_welcomed_by_the_next_leader_an_older_agents_ended():
    async with replicas() as r, grpc.aio.insecure_channel(r.follower) as channel:
        kept_node, old_node = r.node(0), r.node(1)
        kept = await connect(channel, kept_node, resyncs=True)
        old = await connect(channel, old_node, resyncs=False)
        assert kept_node in r.runtimes[0].state.nodes and kept_node not in r.runtimes[1].state.nodes
        async with beating(kept):
            r.leads[0] = r.second  # etcd names another leader: the relay to the first moves on
            await ends(old)  # an agent that would not resync reconnects, as before
            again = await read_until(kept, "welcome")  # the same stream, the new leader's Welcome
        assert again.welcome.node_id == kept_node
        new_leader = r.runtimes[1]
        assert new_leader.soft.nodes[kept_node].stream_id is not None
        assert r.shard.kept_across_leaders == 1 and r.shard.leader_address == r.second
        await kept.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=7, want_ack=True)))
        ack = await read_until(kept, "heartbeat_ack")  # admitted by the new leader, through the shard
        assert ack.heartbeat_ack.seq == 7
        kept.cancel()


async def test_kept_streams_end_when_this_replica_is_the_one_that_now_leads():
    async with replicas() as r, grpc.aio.insecure_channel(r.follower) as channel:
        kept = await connect(channel, r.node(0), resyncs=True)
        r.leads[0] = r.follower  # this replica won: its agents come to it directly
        await ends(kept)
        assert r.shard.sessions() == [] and r.shard.kept_across_leaders == 0


async def test_kept_streams_end_when_no_leader_relays_them_in_time(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(shard_module, "KEEP_WITHOUT_LEADER_S", 0.3)
    async with replicas() as r, grpc.aio.insecure_channel(r.follower) as channel:
        kept = await connect(channel, r.node(0), resyncs=True)
        r.leads[0] = ""  # the leader dies and no other is elected
        await r.servers[0].stop(0)
        await until(lambda: not r.shard.relay_up.is_set(), "the relay to end")
        assert len(r.shard.sessions()) == 1, "kept while an election may still name a leader"
        await ends(kept)
        assert r.shard.sessions() == []


async def test_no_kept_stream_is_moved_before_the_next_leader_is_known():
    other = "127.0.0.1:1"  # a third replica, holding agents, that joins while no leader is known
    async with replicas() as r, grpc.aio.insecure_channel(r.follower) as channel:
        node = next(f"n{i}" for i in range(1000) if shard_of(f"n{i}", (other, r.follower)) == other)
        kept = await connect(channel, node, resyncs=True)
        r.leads[0] = ""  # the leader dies; no other is elected yet
        await r.servers[0].stop(0)
        await until(lambda: not r.shard.relay_up.is_set(), "the relay to end")
        r.shard._live = lambda: (r.second, r.follower, other)  # the live set changed
        assert r.shard.rehome() == 0 and len(r.shard.sessions()) == 1, "held for the next leader"
        async with beating(kept):
            r.leads[0] = r.second
            await read_until(kept, "welcome")
        assert r.shard.rehome() == 1, "moved once a leader is known (the second, which holds no agents)"
        told = await read_until(kept, "not_leader")
        assert told.not_leader.shard_address == other


async def test_an_empty_leader_lookup_moves_no_node_to_the_leader_this_shard_relays_to():
    """The follower's leader lookup came back empty (here it never answers: etcd slow): the replica
    it relays to still leads and, with two replicas live, holds no agents. A node that would hash
    to it is held here, and the periodic pass moves nothing to it (at 12,500 nodes a blank lookup
    moved 241 nodes to the leader, which sent them back, until they were declared dead)."""
    async with replicas() as r, grpc.aio.insecure_channel(r.follower) as channel:
        node = next(f"n{i}" for i in range(1000) if shard_of(f"n{i}", (r.first, r.follower)) == r.first)
        call = await connect(channel, node, resyncs=True)  # welcomed through this shard, not redirected
        assert r.shard.leader_now() == r.first
        assert r.shard.rehome() == 0 and [s.node_id for s in r.shard.sessions()] == [node]
        call.cancel()


async def test_a_kept_agent_that_went_silent_is_not_vouched_for_to_the_next_leader():
    """A hung agent whose connection lives on: replaying its Hello would have the next leader admit
    it again (a dead one even un-quarantined), on the shard's word alone."""
    async with replicas() as r, grpc.aio.insecure_channel(r.follower) as channel:
        silent_node, live_node = r.node(0), r.node(1)
        silent = await connect(channel, silent_node, resyncs=True)
        live = await connect(channel, live_node, resyncs=True)
        by_node = {s.node_id: s for s in r.shard.sessions()}
        by_node[silent_node].last_heard_s -= 3 * by_node[silent_node].interval_s  # silent for 3 intervals
        async with beating(live):
            r.leads[0] = r.second
            await read_until(live, "welcome")
            await ends(silent)
        assert silent_node not in r.runtimes[1].state.nodes and live_node in r.runtimes[1].state.nodes
        assert r.shard.kept_across_leaders == 1
        live.cancel()


def test_what_a_kept_agent_sent_that_was_queued_for_the_old_leader_follows_its_replayed_hello():
    """Queued and not yet taken when the relay ended: a kept agent's step report or Xid is sent to
    the next leader behind its Hello (it was dropped before); an ended agent's items are dropped."""
    import time

    from ftsup.supervisor.outbox import StreamOutbox
    from ftsup.supervisor.shard import ShardSession

    shard = LinkShard("127.0.0.1:1", lambda: ("127.0.0.1:1",))
    now = time.monotonic()
    shard._sessions[1] = ShardSession(1, "n1", 1, StreamOutbox(), now, now, hello=hello_message("n1"))
    shard._sessions[2] = ShardSession(2, "n2", 1, StreamOutbox(), now, now)  # an older agent: ended
    for item in (forwarded(1, "n1", 1, xid(79)), forwarded(2, "n2", 1, xid(48)), forwarded(1, "n1", 1, beat(3))):
        shard._up.push(item)
    assert shard.keep_for_the_next_leader("test") == 1
    assert shard._replay_hellos() == 1
    assert kinds(shard._up.take()) == [(1, "hello"), (1, "xid_event"), (1, "hb3")]


def test_an_up_queue_keeps_only_the_named_sessions_and_still_folds_their_heartbeats():
    queue = UpQueue()
    queue.push(forwarded(1, "n1", 1, beat(1)))
    queue.push(forwarded(2, "n2", 1, xid(79)))
    queue.push(forwarded(1, "n1", 1, xid(48)))
    assert queue.keep_sessions({1}) == 2
    queue.push(forwarded(1, "n1", 1, beat(2)))  # folds into the kept heartbeat, at its new place
    assert kinds(queue.take()) == [(1, "hb2"), (1, "xid_event")]
