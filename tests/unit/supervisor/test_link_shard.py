"""Link shards' forwarding: what a shard queues for the leader, where a node is homed, and a
follower's shard relaying a real agent stream to a real leader runtime over in-process gRPC
(the leader admits it as the agent's own; a shard's death is no death signal; only a replica's
certificate may relay)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.common import holdings_pack, tls
from ftsup.common.shard_map import home_of, shard_of
from ftsup.harness.certs import main as certs_main
from ftsup.harness.chaos.proxy import PartitionProxy
from ftsup.harness.cluster import free_port
from ftsup.supervisor import shard as shard_module
from ftsup.supervisor.core.events import NodeDeclaredDead
from ftsup.supervisor.core.inputs import HeardFrom, Tick
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server import step_aggregate
from ftsup.supervisor.server.agent_service import AgentService
from ftsup.supervisor.server.relay_service import RelayDown, RelayRoute, RelayService
from ftsup.supervisor.shard import UP_BURST_S, UP_LINGER_S, LinkShard, ShardSession, keeps_lingering
from ftsup.supervisor.shard_members import parse_members
from ftsup.supervisor.shard_queue import MAX_BATCH_BYTES, HeardSince, UpQueue, fold_step_reports, forwarded, lingers
from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2, shard_pb2, shard_pb2_grpc
from tests.support.builders import config


def beat(seq: int) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq))


def xid(code: int) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(xid_event=agent_pb2.XidEvent(code=code))


def kinds(items: list[shard_pb2.Forwarded]) -> list[tuple[int, str]]:
    out = []
    for item in items:
        if item.WhichOneof("kind") == "closed":
            out.append((item.session, "closed"))
        elif item.message.WhichOneof("kind") == "heartbeat":
            out.append((item.session, f"hb{item.message.heartbeat.seq}"))
        else:
            out.append((item.session, item.message.WhichOneof("kind")))
    return out


# -- the shard's queue to the leader (pure) --------------------------------------------------------
def test_a_sessions_queued_heartbeats_fold_into_its_newest_and_everything_else_keeps_its_order():
    queue = UpQueue()
    for item in (forwarded(1, "a", 1, beat(1)), forwarded(2, "b", 1, beat(1)), forwarded(1, "a", 1, xid(79)),
                 forwarded(1, "a", 1, beat(2)), forwarded(2, "b", 1, xid(48)), forwarded(1, "a", 1, beat(3))):
        assert queue.push(item)
    assert kinds(queue.take()) == [(1, "hb3"), (2, "hb1"), (1, "xid_event"), (2, "xid_event")]
    assert queue.folded == 2 and len(queue) == 0


def test_a_batch_stays_under_the_leaders_message_limit_however_large_its_items():
    tail = "x" * 4096  # a trainer exit's output tail at its bound
    exits = [forwarded(n, f"n{n}", 1, agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(
        generation=1, rank=n, exit_code=1, output_tail=tail))) for n in range(2_000)]
    queue = UpQueue()
    for item in exits:
        assert queue.push(item)
    batches = []
    while len(queue):
        batch = queue.take()
        assert batch and shard_pb2.ShardBatch(items=batch).ByteSize() <= MAX_BATCH_BYTES
        batches.append(batch)
    assert [i.session for b in batches for i in b] == list(range(2_000)) and len(batches) > 1
    huge = forwarded(1, "a", 1, agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(output_tail="y" * (3 << 20))))
    assert queue.push(huge) and queue.take() == [huge]  # one item always goes, whatever its size


def test_a_heartbeat_after_a_partial_take_folds_into_the_one_still_queued():
    queue = UpQueue()
    for item in (forwarded(1, "a", 1, xid(1)), forwarded(2, "b", 1, beat(1)), forwarded(2, "b", 1, xid(2))):
        queue.push(item)
    assert kinds(queue.take(1)) == [(1, "xid_event")]
    queue.push(forwarded(2, "b", 1, beat(2)))
    assert kinds(queue.take()) == [(2, "hb2"), (2, "xid_event")]


def test_a_heartbeat_never_folds_across_the_end_of_its_session():
    queue = UpQueue()
    queue.push(forwarded(1, "a", 1, beat(1)))
    queue.push(forwarded(1, "a", 1, moved=False))
    queue.push(forwarded(1, "a", 1, beat(2)))
    assert kinds(queue.take()) == [(1, "hb1"), (1, "closed"), (1, "hb2")]


def test_a_full_queue_refuses_instead_of_growing_but_still_folds_a_queued_sessions_heartbeat():
    queue = UpQueue(capacity=2)
    assert queue.push(forwarded(1, "a", 1, beat(1))) and queue.push(forwarded(1, "a", 1, xid(79)))
    assert not queue.push(forwarded(2, "b", 1, xid(48)))
    assert not queue.push(forwarded(2, "b", 1, beat(1)))
    assert queue.push(forwarded(1, "a", 1, beat(2))), "folding takes no room"
    assert len(queue) == 2
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        UpQueue(capacity=0)


def test_the_queue_is_urgent_exactly_while_it_holds_something_that_must_not_wait_for_a_burst():
    queue = UpQueue()
    assert queue.push(forwarded(1, "a", 1, report(0))) and queue.push(forwarded(2, "b", 1, beat(1)))
    assert not queue.urgent, "a step's reports and heartbeats may wait for the rest of the step"
    queue.push(forwarded(3, "c", 1, xid(79)))
    assert queue.urgent
    assert kinds(queue.take(2)) == [(1, "step_report"), (2, "hb1")]
    assert queue.urgent, "the Xid is still queued"
    queue.take()
    assert not queue.urgent and len(queue) == 0
    queue.push(forwarded(4, "d", 1, moved=False))  # a stream's end: the leader's death signal
    queue.push(forwarded(1, "a", 1, report(1)))
    assert queue.urgent
    assert kinds(queue.take(1)) == [(4, "closed")] and not queue.urgent, "only a step's report is left"
    queue.clear()
    queue.push(forwarded(1, "a", 1, report(2)))
    queue.put_first([forwarded(5, "e", 1, agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id="e")))])
    assert queue.urgent, "a replayed Hello goes at once"
    assert queue.keep_sessions({1}) == 1 and not queue.urgent
    queue.push(forwarded(6, "f", 1, xid(48)))
    queue.clear()
    assert not queue.urgent


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["report", "beat", "xid", "closed", "first", "take", "keep", "clear"]),
                          st.integers(1, 4), st.integers(1, 3)), max_size=40))
def test_the_queues_urgency_is_what_it_holds_whatever_came_and_went(script):
    queue = UpQueue()
    for what, session, n in script:
        if what == "report":
            queue.push(forwarded(session, "a", 1, report(n)))
        elif what == "beat":
            queue.push(forwarded(session, "a", 1, beat(n)))
        elif what == "xid":
            queue.push(forwarded(session, "a", 1, xid(n)))
        elif what == "closed":
            queue.push(forwarded(session, "a", 1, moved=False))
        elif what == "first":
            queue.put_first([forwarded(session, "a", 1, xid(n) if n == 1 else report(n))])
        elif what == "take":
            queue.take(n)
        elif what == "keep":
            queue.keep_sessions({session})
        else:
            queue.clear()
        assert queue.urgent == any(not lingers(item) for item in queue._items if item is not None)


def test_a_relay_holds_a_batch_open_only_while_a_steps_burst_keeps_arriving():
    assert keeps_lingering(10, 25, UP_LINGER_S, urgent=False), "the burst goes on: wait for more of it"
    assert not keeps_lingering(25, 25, UP_LINGER_S, urgent=False), "nothing came in the last linger"
    assert not keeps_lingering(10, 25, UP_LINGER_S, urgent=True), "a Hello or a stream's end is queued"
    assert keeps_lingering(10, 25, UP_BURST_S - UP_LINGER_S, urgent=False)
    assert not keeps_lingering(10, 25, UP_BURST_S - UP_LINGER_S / 2, urgent=False), "at most UP_BURST_S"
    incomplete = {"urgent": False, "step_incomplete": True}  # (fewer have reported this step than the last)
    assert keeps_lingering(25, 25, UP_LINGER_S, **incomplete), "a gap in a step's burst: wait on"
    assert not keeps_lingering(25, 25, UP_LINGER_S, urgent=True, step_incomplete=True)
    assert not keeps_lingering(25, 25, UP_BURST_S - UP_LINGER_S / 2, **incomplete), "at most UP_BURST_S"


async def test_a_relay_waits_through_a_gap_in_a_steps_burst_until_every_node_that_reported_the_last_step_did(
        monkeypatch):
    """Three nodes reported step 4; two report step 5 at once and the third 0.1 s later: the relay
    holds the batch through the gap (a 5 ms linger alone would have sent the two) and sends it as
    soon as the third came, well before the budget. Once all three reported, a late fourth message
    is not waited for."""
    monkeypatch.setattr(shard_module, "UP_BURST_S", 5.0)
    shard = LinkShard("r1:1", lambda: ("r1:1",))
    clock = asyncio.get_running_loop().time

    def aggregate(session: int, step: int) -> shard_pb2.Forwarded:
        return forwarded(session, f"n{session}", 1, agent_pb2.AgentMessage(step_aggregate=agent_pb2.StepAggregate(
            generation=1, step=step, ranks=[0], step_time_s=[1.0], compute_time_s=[0.5], loss=[2.0])))

    for session in (1, 2, 3):
        shard._up.push(aggregate(session, 4))
    shard._up.take()
    for session in (1, 2):
        shard._up.push(aggregate(session, 5))
    assert shard._up.steps.incomplete

    async def the_third_after_a_gap() -> None:
        await asyncio.sleep(0.1)
        shard._up.push(aggregate(3, 5))

    late = asyncio.create_task(the_third_after_a_gap())
    started = clock()
    await shard._linger()
    waited_s, queued = clock() - started, len(shard._up)
    await late
    assert queued == 3, "the batch was sent before the step's burst was over"
    assert waited_s < 2.0, f"waited {waited_s:.2f}s: a complete step must end the wait"
    assert not shard._up.steps.incomplete

    async def a_late_message() -> None:
        await asyncio.sleep(1.0)
        shard._up.push(aggregate(1, 6))

    late = asyncio.create_task(a_late_message())
    await shard._linger()
    assert len(shard._up) == 3, "a complete step's batch waited for more"
    late.cancel()
    await asyncio.gather(late, return_exceptions=True)


def report(rank: int, step: int = 5, generation: int = 1, digest: str = "d") -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(step_report=agent_pb2.StepReport(
        generation=generation, rank=rank, step=step, step_time_s=1.0, compute_time_s=0.5 + rank / 10, loss=2.0,
        param_digest=digest))


def expand(items: list[shard_pb2.Forwarded]) -> list[tuple[int, str, object]]:
    """Each item as the leader sees it: an aggregate as its reports, one by one, in order."""
    out: list[tuple[int, str, object]] = []
    for item in items:
        kind = item.message.WhichOneof("kind") if item.WhichOneof("kind") == "message" else "closed"
        if kind == "step_aggregate":
            for r in step_aggregate.to_input(item.node_id, item.message.step_aggregate).reports():
                out.append((item.session, "step_report", (r.generation, r.step, r.rank, r.compute_time_s, r.param_digest)))
        elif kind == "step_report":
            r = step_aggregate.report_from_proto(item.node_id, item.message.step_report)
            out.append((item.session, "step_report", (r.generation, r.step, r.rank, r.compute_time_s, r.param_digest)))
        else:
            out.append((item.session, kind or "", None))
    return out


def test_a_nodes_queued_step_reports_of_one_step_go_up_as_one_aggregate_in_the_first_ones_place():
    queue = UpQueue()
    for item in (forwarded(1, "a", 1, report(0)), forwarded(2, "b", 1, report(0)), forwarded(1, "a", 1, beat(1)),
                 forwarded(1, "a", 1, report(1, digest="e")), forwarded(2, "b", 1, xid(79)),
                 forwarded(1, "a", 1, report(2)), forwarded(2, "b", 1, report(1))):
        queue.push(item)
    items = queue.take()
    assert [(i.session, i.message.WhichOneof("kind")) for i in items] == [
        (1, "step_aggregate"), (2, "step_report"), (1, "heartbeat"), (2, "xid_event"), (2, "step_report")]
    aggregate = step_aggregate.to_input("a", items[0].message.step_aggregate)
    assert [r.rank for r in aggregate.reports()] == [0, 1, 2] and aggregate.step == 5
    assert [r.param_digest for r in aggregate.reports()] == ["d", "e", "d"]
    assert {r.node_id for r in aggregate.reports()} == {"a"} and queue.reports_folded == 2


def test_the_folds_of_an_older_agents_reports_run_only_on_a_batch_that_holds_one(monkeypatch):
    import ftsup.supervisor.shard_queue as shard_queue

    passes: list[int] = []
    real = shard_queue.fold_step_reports
    monkeypatch.setattr(shard_queue, "fold_step_reports", lambda items: passes.append(len(items)) or real(items))
    queue = UpQueue()
    queue.push(forwarded(1, "a", 1, beat(1)))
    queue.push(forwarded(2, "b", 1, xid(79)))
    assert len(queue.take()) == 2 and passes == [], "nothing of an older agent queued: no pass"
    for item in (forwarded(1, "a", 1, report(0)), forwarded(1, "a", 1, report(1)), forwarded(2, "b", 1, xid(79))):
        queue.push(item)
    assert len(queue.take(max_items=1)) == 1 and passes == [1]
    assert [i.message.WhichOneof("kind") for i in queue.take()] == ["step_report", "xid_event"] and passes == [1, 2]
    queue.push(forwarded(2, "b", 1, xid(79)))
    assert len(queue.take()) == 1 and passes == [1, 2], "the count went back to none"
    queue.put_first([forwarded(1, "a", 1, report(0))])
    queue.take()
    assert passes == [1, 2, 1], "a replayed item counts too"


def test_a_run_of_reports_ends_at_another_message_of_its_session_a_new_step_or_a_repeated_rank():
    items = fold_step_reports([forwarded(1, "a", 1, m) for m in (
        report(0), report(1), xid(79), report(2), report(3), report(0, step=6), report(1, step=6), report(1, step=6))])
    assert [i.message.WhichOneof("kind") for i in items] == [
        "step_aggregate", "xid_event", "step_aggregate", "step_aggregate", "step_report"]


messages = st.sampled_from(["hb", "xid", "closed", "r0", "r1", "r2", "r0s6", "r1s6"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), messages), max_size=40), st.integers(1, 50))
def test_folding_hands_the_leader_every_report_once_in_its_sessions_order(script, take):
    def item(session: int, name: str) -> shard_pb2.Forwarded:
        if name == "hb":
            return forwarded(session, f"n{session}", 1, beat(1))
        if name == "xid":
            return forwarded(session, f"n{session}", 1, xid(79))
        if name == "closed":
            return forwarded(session, f"n{session}", 1, moved=False)
        rank, _, step = name[1:].partition("s")
        return forwarded(session, f"n{session}", 1, report(int(rank), step=int(step or 5)))

    sent = [item(session, name) for session, name in script]
    queue = UpQueue()
    for each in sent:
        queue.push(each)
    received: list[shard_pb2.Forwarded] = []
    while len(queue):
        received += queue.take(take)
    for session in (1, 2, 3):
        def no_beats(seq: list[tuple[int, str, object]], session: int = session) -> list[tuple[int, str, object]]:
            return [x for x in seq if x[0] == session and x[1] != "heartbeat"]
        assert no_beats(expand(received)) == no_beats(expand(sent)), "reports and facts: all, once, in order"
    for session in {s for s, _ in script}:  # liveness: a session that beat is still heard from
        if any(s == session and n == "hb" for s, n in script):
            assert any(x[0] == session and x[1] == "heartbeat" for x in expand(received))


# -- where a node is homed (pure) ------------------------------------------------------------------
def test_a_node_is_homed_on_its_rendezvous_shard_unless_its_agent_could_not_reach_that_one():
    live = ["r1:1", "r2:1", "r3:1"]
    for node in (f"node-{i}" for i in range(200)):
        first = shard_of(node, live)
        assert home_of(node, live, "r1:1") == first
        rest = [r for r in live if r != first]
        assert home_of(node, live, "r1:1", unreachable=[first]) in (rest if first != "r1:1" else live)
        assert home_of(node, live, first, unreachable=[first]) == first, "the replica reached is never excluded"
        if first != "r1:1":  # the dead shard's nodes go where rendezvous hashing sends them next
            assert home_of(node, live, "r1:1", unreachable=[first]) == shard_of(node, rest)


def test_membership_keys_name_the_live_replicas_and_nothing_else():
    keys = [b"/p/replicas/10.0.0.1:7000", b"/p/replicas/", b"/p/replicasX/a", b"/p/log/1", b"/p/replicas/h:1"]
    assert parse_members("/p", keys) == frozenset({"10.0.0.1:7000", "h:1"})


def test_a_relay_route_wraps_what_the_runtime_sends_a_node_and_ends_the_relay_when_full():
    down = RelayDown(capacity=2)
    route = RelayRoute(down, session=7)
    assert route.put(agent_pb2.SupervisorMessage(welcome=agent_pb2.Welcome(node_id="a")))
    route.close()
    assert not route.put(agent_pb2.SupervisorMessage()), "closed"
    items = down.take()
    assert [(i.session, i.HasField("message"), i.close) for i in items] == [(7, True, False), (7, False, True)]
    other = RelayRoute(down, session=8)
    for _ in range(2):
        other.put(agent_pb2.SupervisorMessage())
    assert not other.put(agent_pb2.SupervisorMessage()) and down.overflowed


# -- a follower's shard relaying to a leader over real gRPC ------------------------------------------
def test_the_leader_checks_a_relayed_hello_as_it_checks_its_own():
    runtime = Runtime(config(nodes=1), MemoryLog(), tick_s=0.05)
    relay, down, sessions = RelayService(runtime), RelayDown(), {}
    bad = hello_message("n1")
    bad.hello.host = "h" * 10_000
    relay._on_hello(forwarded(1, "n1", 1, bad), down, sessions)
    items = down.take()
    assert not sessions and items[0].message.refusal.refused == "hello" and items[-1].close
    assert "host" in items[0].message.refusal.reason


def test_a_summary_names_each_session_heard_once_and_owes_only_the_acks_asked_for():
    heard = HeardSince()
    assert not heard
    heard.note(5, ack_seq=11)
    heard.note(6)
    heard.note(5, ack_seq=12)  # the newest ack asked for is the one owed
    heard.note(6)
    sessions, first = heard.take()
    assert (sessions, first) == ([5, 6], 1) and not heard
    heard.note(7, ack_seq=3)
    _, second = heard.take()
    assert heard.admitted(0) == []
    assert heard.admitted(first) == [(5, 12)], "acks wait for their own summary's admission"
    assert heard.admitted(second) == [(7, 3)] and heard.admitted(second) == [], "each ack is owed once"


def test_each_admitted_summary_reports_the_age_of_its_oldest_heartbeat_acks_asked_or_not():
    now, ages = [100.0], []
    heard = HeardSince(max_owed=2, clock=lambda: now[0], on_admitted=ages.append)
    heard.note(1)
    now[0] = 100.05
    heard.note(2)
    _, first = heard.take()  # first heard at 100.0
    now[0] = 100.2
    heard.note(3, ack_seq=7)
    _, second = heard.take()  # at 100.2
    _, empty = heard.take()  # (nothing heard: no news to age)
    now[0] = 100.5
    assert heard.admitted(first) == [] and ages == [pytest.approx(0.5)], "real agents ask no acks"
    now[0] = 100.6
    assert heard.admitted(empty) == [(3, 7)] and ages[1:] == [pytest.approx(0.4)]
    for _ in range(5):  # a leader that never answers: the ages kept are bounded as the acks are
        heard.note(1)
        heard.take()
    assert len(heard._first_heard_s) == 2
    heard.clear()
    assert heard.admitted(1_000) == [] and len(ages) == 2, "a new relay: nothing from the old one"


def test_a_leader_that_never_answers_cannot_grow_the_acks_a_shard_owes():
    heard = HeardSince(max_owed=3)
    for seq in range(1, 11):
        heard.note(1, ack_seq=seq)
        heard.take()
    assert heard.admitted(10) == [(1, 8), (1, 9), (1, 10)]


async def test_a_shard_relaying_to_a_leader_without_summaries_forwards_each_heartbeat():
    shard = LinkShard("r1:1", lambda: ("r1:1",))

    async def stream(*messages: agent_pb2.AgentMessage) -> AsyncIterator[agent_pb2.AgentMessage]:
        for message in messages:
            yield message

    for summarises, queued, heard in ((False, 2, 0), (True, 1, 1)):
        shard.summarises = summarises
        shard._up.clear()
        shard._heard.clear()
        session = ShardSession(1, "n1", 1, StreamOutbox(), 0.0, 0.0)
        await shard._read(session, stream(beat(1), xid(79), beat(2)))
        assert (len(shard._up), len(shard._heard)) == (queued, heard), summarises


async def until(predicate: Callable[[], object], what: str, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(0.01)


def hello_message(node_id: str, incarnation: int = 1, peer_port: int = 9000) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(hello=agent_pb2.Hello(
        node_id=node_id, incarnation=incarnation, host="127.0.0.1", peer_port=peer_port,
        role=events_pb2.NODE_ROLE_ACTIVE))


class Pair:
    """A leader replica (runtime, relay service, agent service) and a follower replica (a runtime
    that follows, its link shard relaying to the leader), each on its own gRPC server."""

    def __init__(self, leader: str, follower: str, ports: tuple[int, int], servers: list[grpc.aio.Server],
                 runtime: Runtime, relay: RelayService, shard: LinkShard, relaying: asyncio.Task[None]) -> None:
        self.leader, self.follower, self.ports, self.servers = leader, follower, ports, servers
        self.runtime, self.relay, self.shard, self.relaying = runtime, relay, shard, relaying


@contextlib.asynccontextmanager
async def pair(ranks_per_node: int = 1, relay_type: type[RelayService] = RelayService,
               reconnect_grace_s: float | None = None, nodes: int = 1) -> AsyncIterator[Pair]:
    cfg = config(nodes=nodes, ranks_per_node=ranks_per_node)
    if reconnect_grace_s is not None:
        cfg = dataclasses.replace(cfg, detector=dataclasses.replace(cfg.detector, reconnect_grace_s=reconnect_grace_s))
    runtime = Runtime(cfg, MemoryLog(), tick_s=0.05)
    follower_runtime = Runtime(config(nodes=1, ranks_per_node=ranks_per_node), MemoryLog(), tick_s=0.05)
    follower_runtime.become_follower()
    servers = [grpc.aio.server(), grpc.aio.server()]
    ports = tuple(server.add_insecure_port("127.0.0.1:0") for server in servers)
    leader, follower = (f"127.0.0.1:{port}" for port in ports)
    live = (leader, follower)
    relay = relay_type(runtime)
    shard_pb2_grpc.add_LinkShardServicer_to_server(relay, servers[0])
    agent_pb2_grpc.add_SupervisorServicer_to_server(
        AgentService(runtime, shard=LinkShard(leader, lambda: live)), servers[0])
    shard = LinkShard(follower, lambda: live)
    agent_pb2_grpc.add_SupervisorServicer_to_server(AgentService(follower_runtime, shard=shard), servers[1])
    for server in servers:
        await server.start()
    tasks = [asyncio.create_task(runtime.run()), asyncio.create_task(shard.relay_forever(lambda: leader))]
    try:
        yield Pair(leader, follower, ports, servers, runtime, relay, shard, tasks[1])  # type: ignore[arg-type]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in servers:
            await server.stop(0)


def homed_on(replica: str, live: tuple[str, str]) -> str:
    return next(f"n{i}" for i in range(1000) if shard_of(f"n{i}", live) == replica)


async def read_until(call: grpc.aio.StreamStreamCall, kind: str) -> agent_pb2.SupervisorMessage:
    while True:
        message = await asyncio.wait_for(call.read(), 5.0)
        assert message is not grpc.aio.EOF, f"the stream ended before a {kind}"
        if message.WhichOneof("kind") == kind:
            return message


@contextlib.asynccontextmanager
async def welcomed_on_the_follower(p: Pair, peer_port: int = 9000) -> AsyncIterator[tuple[str, grpc.aio.StreamStreamCall]]:
    """An agent's stream to the follower, for a node homed there, once the leader welcomed it."""
    await until(p.shard.relay_up.is_set, "the shard's relay to the leader")
    node = homed_on(p.follower, (p.leader, p.follower))
    async with grpc.aio.insecure_channel(p.follower) as channel:
        call = agent_pb2_grpc.SupervisorStub(channel).Connect()
        await call.write(hello_message(node, peer_port=peer_port))
        await read_until(call, "welcome")
        yield node, call


async def test_a_shard_relays_its_nodes_hello_reports_and_directives_and_a_closed_stream_is_a_death_signal():
    async with pair() as p:
        await until(p.shard.relay_up.is_set, "the shard's relay to the leader")
        node = homed_on(p.follower, (p.leader, p.follower))
        async with grpc.aio.insecure_channel(p.follower) as channel:
            call = agent_pb2_grpc.SupervisorStub(channel).Connect()
            await call.write(hello_message(node))
            welcome = await read_until(call, "welcome")
            assert welcome.welcome.node_id == node and node in p.runtime.state.nodes
            directive = await read_until(call, "directive")  # the leader started the one-node job
            assert directive.directive.generation == p.runtime.state.generation.number
            heard = p.runtime.soft.nodes[node].last_heard_s
            await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1, want_ack=True)))
            ack = await read_until(call, "heartbeat_ack")
            assert ack.heartbeat_ack.seq == 1 and p.runtime.soft.nodes[node].last_heard_s > heard
            await call.write(agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(generation=99, rank=0)))
            refusal = await read_until(call, "refusal")
            assert refusal.refusal.refused == "TrainerExit" and "generation 99" in refusal.refusal.reason
            assert p.relay.relays == {p.follower: 1}
            call.cancel()
        await until(lambda: p.runtime.soft.nodes[node].stream_id is None, "the leader to see the stream close")
        assert p.runtime.soft.nodes[node].disconnected_at_s is not None, "an agent's closed stream: suspect now"


async def test_heartbeats_that_ask_no_ack_gather_into_one_summary_and_an_ack_sends_it_at_once(monkeypatch):
    """A summary owing no ack gathers (SUMMARY_GATHER_S, long here): a heartbeat 0.1 s after
    another goes in the same summary, and one asking an ack sends it without waiting the gather
    out (its ack comes well before it would end)."""
    monkeypatch.setattr(shard_module, "SUMMARY_GATHER_S", 30.0)
    async with pair() as p, welcomed_on_the_follower(p) as (node, call):
        named: list[tuple[str, ...]] = []
        submit = p.runtime.submit

        def spied(inp: object, *rest: object, **kw: object) -> object:
            if isinstance(inp, HeardFrom) and node in inp.node_ids:
                named.append(inp.node_ids)
            return submit(inp, *rest, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(p.runtime, "submit", spied)
        await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1)))
        await asyncio.sleep(0.1)  # (past SUMMARY_INTERVAL_S: without the gather, a summary of its own)
        await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=2, want_ack=True)))
        ack = await asyncio.wait_for(read_until(call, "heartbeat_ack"), 10.0)
        assert ack.heartbeat_ack.seq == 2
        assert named == [(node,)], named


async def test_a_commit_s_retain_notice_goes_to_a_shard_once_for_all_its_nodes(monkeypatch):
    """Two nodes on the follower's shard, both taking SnapshotRetain: each commit is one item on
    the relay naming both sessions (RelayDown.put_shared), and each agent reads its notice."""
    shared: list[list[int]] = []
    put_shared = RelayDown.put_shared

    def spied(self: RelayDown, sessions: list[int], message: agent_pb2.SupervisorMessage) -> bool:
        shared.append(list(sessions))
        return put_shared(self, sessions, message)

    monkeypatch.setattr(RelayDown, "put_shared", spied)
    async with pair(nodes=2) as p:
        await until(p.shard.relay_up.is_set, "the shard's relay to the leader")
        live = (p.leader, p.follower)
        nodes = [f"n{i}" for i in range(1000) if shard_of(f"n{i}", live) == p.follower][:2]
        async with grpc.aio.insecure_channel(p.follower) as channel:
            calls = {}
            for node in nodes:
                calls[node] = agent_pb2_grpc.SupervisorStub(channel).Connect()
                hello = hello_message(node)
                hello.hello.takes_snapshot_retain = True
                await calls[node].write(hello)
                await read_until(calls[node], "welcome")
            directives = {}
            for node, call in calls.items():
                while not directives.get(node, agent_pb2.Directive()).ranks:  # (the generation's, not a wait)
                    directives[node] = (await read_until(call, "directive")).directive
            generation = p.runtime.state.generation
            assert generation is not None
            for node, call in calls.items():
                rank = directives[node].ranks[0]
                await call.write(agent_pb2.AgentMessage(step_report=agent_pb2.StepReport(
                    generation=generation.number, rank=rank, step=1, step_time_s=1.0, compute_time_s=0.5,
                    param_digest="d1")))
            for call in calls.values():  # its own rank and its buddy's copy
                await call.write(agent_pb2.AgentMessage(snapshot_holdings=holdings_pack.pack([
                    agent_pb2.SnapshotReport(generation=generation.number, rank=r, step=1, size_bytes=10,
                                             sha256=f"s{r}") for r in (0, 1)])))
            notices = {node: (await read_until(call, "snapshot_retain")).snapshot_retain for node, call in calls.items()}
            assert {(n.generation, n.retain_from_step) for n in notices.values()} == {(generation.number, 1)}
            assert len(shared) == 1 and len(shared[0]) == 2, shared
            for call in calls.values():
                call.cancel()


@contextlib.contextmanager
def agent_peer_port() -> Iterator[socket.socket]:
    """A listening socket, as a live agent's peer service, until closed or the block ends."""
    listening = socket.socket()
    try:
        listening.bind(("127.0.0.1", free_port()))
        listening.listen()
        yield listening
    finally:
        listening.close()


async def test_a_shard_probes_its_own_nodes_agents_and_the_leader_none_of_them():
    """The shard calibrates its node's peer port (the leader never connects to it) and, once the
    agent is gone, reports it: with a 30 s grace only that report ends the node promptly. Without
    the shard's probe (or with the leader still probing relayed nodes) this times out."""
    async with pair(reconnect_grace_s=30.0) as p:
        with agent_peer_port() as port:
            async with welcomed_on_the_follower(p, peer_port=port.getsockname()[1]) as (node, call):
                assert p.shard.probes_agents, "this leader takes agent_gone reports"
                await until(lambda: p.shard.probes.is_calibrated(node), "the shard to calibrate its node's port")
                await until(lambda: not p.runtime.probes.pending(), "the leader's calibration queue to drain")
                assert not p.runtime.probes.is_calibrated(node) and not p.runtime.probes.in_flight()
                port.close()  # the node dies: its agent's port, then its stream
                call.cancel()

        def dead() -> list[NodeDeclaredDead]:
            return [r.event for r in p.runtime.event_log.read(1) if isinstance(r.event, NodeDeclaredDead)]

        await until(dead, "the leader to declare the node dead on its shard's report", timeout_s=10.0)
        assert [d.node_id for d in dead()] == [node] and "refuses connections" in dead()[0].reason


async def test_the_leader_probes_the_nodes_of_a_shard_that_does_not_probe_them():
    """A shard from before shard-side probes (or one that does not offer them): the leader
    calibrates its nodes itself, as it did, so a gone agent is still found."""
    async with pair(reconnect_grace_s=30.0) as p:
        p.shard.offers_probes = False  # (before its relay's first batch)
        with agent_peer_port() as port:
            async with welcomed_on_the_follower(p, peer_port=port.getsockname()[1]) as (node, call):
                assert not p.shard.probes_agents
                await until(lambda: p.runtime.probes.is_calibrated(node), "the leader to calibrate the node's port")
                assert not p.shard.probes.is_calibrated(node)
                call.cancel()


def test_a_session_is_queued_for_calibration_once_not_again_at_the_next_leaders_welcome():
    shard = LinkShard("r1:1", lambda: ("r1:1",))
    shard.probes_agents = True
    shard._sessions[1] = ShardSession(1, "n1", 1, StreamOutbox(), 0.0, 0.0, peer=("127.0.0.1", 9000))
    shard._node_session["n1"] = 1
    welcome = shard_pb2.Addressed(session=1, message=agent_pb2.SupervisorMessage(
        welcome=agent_pb2.Welcome(node_id="n1", heartbeat_interval_s=1.0)))
    shard._deliver(shard_pb2.LeaderBatch(items=[welcome]))
    assert shard.probes.pending() == 1
    shard.probes.calibrate(lambda node: None)  # (tried: nothing listens in this test)
    shard._deliver(shard_pb2.LeaderBatch(items=[welcome]))  # a kept stream welcomed by the next leader
    assert shard.probes.pending() == 0


async def test_an_agent_gone_report_for_a_session_the_leader_does_not_know_decides_nothing():
    async with pair(reconnect_grace_s=30.0) as p, welcomed_on_the_follower(p) as (node, call):
        session = p.shard._node_session[node]
        p.shard._up.push(forwarded(session + 1000, node, 1, gone="forged: never closed"))
        p.shard._up.push(forwarded(session, node, 1, gone="not closed yet"))
        p.shard._up_ready.set()
        # A relayed message queued behind the reports: its refusal comes once they were read.
        await call.write(agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(generation=99, rank=0)))
        await read_until(call, "refusal")
        assert p.runtime.soft.nodes[node].stream_id is not None and not p.runtime.soft.nodes[node].agent_gone
        call.cancel()


async def test_a_shard_with_nothing_heard_keeps_alive_and_the_leader_knows_its_nodes_by_it():
    """The leader's core learns which shard speaks for a node and hears the shard itself at its
    keepalive pace while no node says anything (so a quiet shard is told from quiet nodes)."""
    async with pair() as p, welcomed_on_the_follower(p) as (node, call):
        await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1, want_ack=True)))
        await read_until(call, "heartbeat_ack")
        assert p.runtime.soft.nodes[node].shard == p.follower
        heard = p.runtime.soft.nodes[node].last_heard_s
        seen: set[float] = set()
        await until(lambda: seen.add(p.runtime.soft.shard_heard_s.get(p.follower, 0.0)) or len(seen) >= 4,
                    "three keepalives with no heartbeat in between")
        assert p.runtime.soft.nodes[node].last_heard_s == heard, "a keepalive hears no node"
        call.cancel()


class StuckRelay(RelayService):
    """A leader stuck admitting the first Xid it is relayed (as one whose queue is full of reports
    would be): the relay's reader, and so the relay stream's flow control, stop there."""

    stuck = asyncio.Event()

    async def _submit(self, run) -> None:  # type: ignore[no-untyped-def]
        if any(message.message.WhichOneof("kind") == "xid_event" for message in run):
            self.stuck.set()
            await asyncio.Event().wait()
        await super()._submit(run)


async def test_liveness_summaries_reach_the_leader_while_its_relay_is_held_back():
    StuckRelay.stuck = asyncio.Event()
    async with pair(relay_type=StuckRelay) as p:
        await until(p.shard.relay_up.is_set, "the shard's relay to the leader")
        assert p.shard.summarises
        node = homed_on(p.follower, (p.leader, p.follower))
        async with grpc.aio.insecure_channel(p.follower) as channel:
            call = agent_pb2_grpc.SupervisorStub(channel).Connect()
            await call.write(hello_message(node))
            await read_until(call, "welcome")
            await call.write(xid(79))
            await asyncio.wait_for(StuckRelay.stuck.wait(), 5.0)
            for seq in (1, 2, 3):
                heard = p.runtime.soft.nodes[node].last_heard_s
                await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq, want_ack=True)))
                ack = await read_until(call, "heartbeat_ack")
                assert ack.heartbeat_ack.seq == seq and p.runtime.soft.nodes[node].last_heard_s > heard
            call.cancel()


async def test_a_relay_to_a_leader_gone_silent_moves_on_as_soon_as_another_leads():
    """A leader that stopped or lost its host sends no reset; its relay would wait for TCP's
    retransmissions (minutes) while its successor hears nothing from this shard's nodes. The relay
    ends once etcd names another leader. The silence is a proxy that stops forwarding and closes
    nothing (harness/chaos/proxy.py); the "successor" is the same runtime at its direct address."""
    runtime = Runtime(config(nodes=1), MemoryLog(), tick_s=0.05)
    server = grpc.aio.server()
    shard_pb2_grpc.add_LinkShardServicer_to_server(RelayService(runtime), server)
    direct = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    running = asyncio.create_task(runtime.run())
    follower = "127.0.0.1:1"
    shard = LinkShard(follower, lambda: (direct, follower))
    with PartitionProxy(direct) as proxy:
        leads = [proxy.address]
        relaying = asyncio.create_task(shard.relay_forever(lambda: leads[0]))
        try:
            await until(lambda: shard.relay_up.is_set() and shard.leader_address == proxy.address,
                        "the relay to the first leader")
            proxy.partition()
            leads[0] = direct  # etcd now names another leader
            await until(lambda: shard.relay_up.is_set() and shard.leader_address == direct,
                        "the relay to the leader etcd names")
        finally:
            for task in (relaying, running):
                task.cancel()
            await asyncio.gather(relaying, running, return_exceptions=True)
            await server.stop(0)


async def test_a_node_of_another_shard_is_told_its_shard_and_a_dead_shards_routes_are_no_death_signal():
    async with pair() as p:
        await until(p.shard.relay_up.is_set, "the shard's relay to the leader")
        # A third replica holds agents too (the leader, which the relay names, holds none here).
        other = "127.0.0.1:1"
        p.shard._live = lambda: (p.leader, p.follower, other)
        async with grpc.aio.insecure_channel(p.follower) as channel:
            elsewhere = homed_on(other, (p.follower, other))
            call = agent_pb2_grpc.SupervisorStub(channel).Connect()
            await call.write(hello_message(elsewhere))
            told = await read_until(call, "not_leader")
            assert told.not_leader.shard_address == other == told.not_leader.leader_address
            # Naming that shard unreachable makes the follower hold it (what a dead shard's agent does).
            call = agent_pb2_grpc.SupervisorStub(channel).Connect()
            message = hello_message(elsewhere)
            message.hello.unreachable_replicas.append(other)
            await call.write(message)
            await read_until(call, "welcome")
            assert p.runtime.soft.nodes[elsewhere].stream_id is not None
            # The shard vanishes (as a SIGKILLed replica: its relay ends, it forwards nothing more).
            p.relaying.cancel()
            await until(lambda: not p.relay.relays, "the leader to drop the shard's relay")
            await p.runtime.submit(Tick())  # handled after anything the relay's end queued
            soft = p.runtime.soft.nodes[elsewhere]
            assert soft.disconnected_at_s is None, "a shard's death is not its nodes' stream closing"


async def test_only_a_supervisor_replicas_certificate_may_open_a_relay(tmp_path: pathlib.Path):
    certs = tmp_path / "certs"
    assert certs_main(["--out", str(certs), "--nodes", "a", "--supervisors", "s1,s2"]) == 0

    def files(name: str) -> tls.TlsFiles:
        return tls.TlsFiles(certs / f"{name}.pem", certs / f"{name}.key", certs / "ca.pem")

    runtime = Runtime(config(nodes=1, ranks_per_node=1), MemoryLog(), tick_s=0.05)
    server = grpc.aio.server()
    shard_pb2_grpc.add_LinkShardServicer_to_server(RelayService(runtime, is_tls=True), server)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(files("supervisor-s1")))
    await server.start()
    try:
        as_node = grpc.aio.secure_channel(f"127.0.0.1:{port}", tls.channel_credentials(files("node-a")),
                                          options=tls.expect_supervisor())
        call = shard_pb2_grpc.LinkShardStub(as_node).Relay()
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # refused before the relay reads anything
            await call.read()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "only a supervisor replica" in (refused.value.details() or "")
        await as_node.close()
        as_replica = grpc.aio.secure_channel(f"127.0.0.1:{port}", tls.channel_credentials(files("supervisor-s2")),
                                             options=tls.expect_supervisor())
        call = shard_pb2_grpc.LinkShardStub(as_replica).Relay()
        await call.write(shard_pb2.ShardBatch(replica="s2"))
        first = await asyncio.wait_for(call.read(), 5.0)
        assert first.term == runtime.term, "a replica is let in"
        call.cancel()
        await as_replica.close()
    finally:
        await server.stop(0)


async def test_a_stopping_shard_tells_its_nodes_their_next_shard_and_the_leader_sees_moves_not_deaths():
    async with pair() as p, welcomed_on_the_follower(p) as (node, call):
        assert p.shard.shutdown() == 1
        told = await read_until(call, "not_leader")
        assert told.not_leader.shard_address == p.leader
        await until(lambda: p.relay.relays.get(p.follower) == 0, "the leader to learn the move")
        await p.runtime.submit(Tick())  # handled after anything the move queued
        assert p.runtime.soft.nodes[node].disconnected_at_s is None, "a move is no stream closing"


async def test_a_nodes_per_rank_step_reports_reach_the_leaders_vote_through_the_shard():
    async with pair(ranks_per_node=4) as p:
        await until(p.shard.relay_up.is_set, "the shard's relay to the leader")
        node = homed_on(p.follower, (p.leader, p.follower))
        async with grpc.aio.insecure_channel(p.follower) as channel:
            call = agent_pb2_grpc.SupervisorStub(channel).Connect()
            await call.write(hello_message(node))
            directive = await read_until(call, "directive")
            generation = directive.directive.generation
            for rank in range(4):  # folded into an aggregate or not, as the shard's queue has them
                await call.write(report(rank, step=1, generation=generation, digest="same"))
            await until(lambda: p.runtime.soft.progress is not None and p.runtime.soft.progress.step_reports == 4,
                        "the leader to observe the four ranks' reports")
            assert 1 in p.runtime.soft.progress.sdc_clear_steps, "the vote saw every rank: they agree"
            call.cancel()
