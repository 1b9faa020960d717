"""A RAM snapshot commit moves every node's retain floor and nothing else of its directive, so the
leader says it in one short SnapshotRetain to each agent that takes one, instead of a whole
directive to every node of the fleet every step (issue 14: ~0.8 s of the leader's CPU per commit
at 12,500 nodes). An agent that does not take it gets the directive as before; the agent's link
hands its launcher the whole directive either way."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import random

import grpc
import structlog

from ftsup.agent.config import AgentConfig
from ftsup.agent.link import Reports, SupervisorLink
from ftsup.common import holdings_pack
from ftsup.supervisor.core.directives import directives_for
from ftsup.supervisor.core.events import SnapshotCommitted
from ftsup.supervisor.core.inputs import SnapshotHoldings, SnapshotReport, StepReport, Tick
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.runtime import Runtime
from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2
from tests.support.async_wait import eventually
from tests.support.builders import NOW, Sim, config, hello
from tests.support.served import served

NODES, RANKS_PER_NODE = 4, 2


def _holders(sim: Sim) -> dict[str, list[int]]:
    """node -> the ranks it holds a copy of (its own and its buddy's)."""
    generation = sim.state.generation
    assert generation is not None
    held: dict[str, list[int]] = {}
    for member in generation.members:
        for node in (member.node_id, member.buddy_node_id):
            held.setdefault(node, []).extend(member.ranks)
    return held


def test_a_commit_names_no_node_and_changes_each_directive_only_in_its_retain_floor():
    sim = Sim(config(nodes=NODES, ranks_per_node=RANKS_PER_NODE))
    for i in range(NODES):
        sim.events(hello(f"n{i}", stream_id=i + 1), at=NOW)
    sim.events(Tick(), at=NOW + 0.1)
    generation = sim.state.generation
    assert generation is not None
    nodes = sorted(sim.state.nodes)
    before = directives_for(sim.state, sim.core.config.job, nodes, sim.waiting_reason)
    for member in generation.members:
        for rank in member.ranks:
            sim.feed(StepReport(member.node_id, generation.number, rank, 3, 0.6, 0.5, 2.0, "d"), at=NOW + 1)
    holders = _holders(sim)
    last = nodes[-1]
    for node in nodes[:-1]:
        sim.feed(SnapshotHoldings.of_reports([SnapshotReport(node, generation.number, r, 3, (node,), 10, f"s{r}")
                                              for r in holders[node]]), at=NOW + 1)
    ready = sim.core.step(SnapshotHoldings.of_reports(
        [SnapshotReport(last, generation.number, r, 3, (last,), 10, f"s{r}") for r in holders[last]]), NOW + 1)
    assert ready.events == (SnapshotCommitted(generation.number, 3),)
    assert ready.affected == (), "a commit alone names no node's directive"
    assert ready.retained == SnapshotCommitted(generation.number, 3)
    sim.core.advance(ready, sim.core.records(ready.events, NOW + 1))
    after = directives_for(sim.state, sim.core.config.job, nodes, sim.waiting_reason)
    assert [d.retain_from_step for d in before] == [0] * NODES
    assert after == [dataclasses.replace(d, retain_from_step=3) for d in before]


async def _until(predicate, what: str) -> None:
    await eventually(predicate, 10.0, what)


class _Agent:
    """One node's stream as a test drives it: what it was sent, in order."""

    def __init__(self, stub: agent_pb2_grpc.SupervisorStub, node_id: str, takes_retain: bool) -> None:
        self.node_id = node_id
        self.call = stub.Connect()
        self.takes_retain = takes_retain
        self.received: list[agent_pb2.SupervisorMessage] = []
        self.reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(
            node_id=self.node_id, incarnation=1, host="127.0.0.1", peer_port=9000, role=events_pb2.NODE_ROLE_ACTIVE,
            takes_snapshot_retain=self.takes_retain)))
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            message = await self.call.read()
            if not isinstance(message, agent_pb2.SupervisorMessage):
                return
            self.received.append(message)

    def kinds(self) -> list[str]:
        return [m.WhichOneof("kind") or "" for m in self.received]

    async def stop(self) -> None:
        """Ends the stream and its reader (awaited: nothing of it outlives the test)."""
        self.call.cancel()
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.gather(self.reader, return_exceptions=True)

    async def acked(self, seq: int) -> None:
        """Everything the supervisor sent this node before it took heartbeat `seq` has arrived."""
        await self.call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq, want_ack=True)))
        await _until(lambda: any(m.heartbeat_ack.seq == seq for m in self.received if m.HasField("heartbeat_ack")),
                     f"{self.node_id}'s ack of heartbeat {seq}")


async def test_a_commit_sends_agents_that_take_it_a_retain_notice_and_the_others_a_whole_directive():
    runtime = Runtime(config(nodes=2, ranks_per_node=2), MemoryLog(), tick_s=0.05)
    async with served(runtime) as stub:
        new, old = _Agent(stub, "n1", takes_retain=True), _Agent(stub, "n2", takes_retain=False)
        try:
            await new.start()
            await old.start()
            await _until(lambda: runtime.state.generation is not None, "the generation to start")
            generation = runtime.state.generation
            assert generation is not None
            await _until(lambda: "directive" in new.kinds() and "directive" in old.kinds(), "both directives")
            holds = {m.node_id: [r for o in generation.members if m.node_id in (o.node_id, o.buddy_node_id)
                                 for r in o.ranks] for m in generation.members}
            for step in (1, 2):
                for agent in (new, old):
                    for rank in generation.member(agent.node_id).ranks:  # type: ignore[union-attr]
                        await agent.call.write(agent_pb2.AgentMessage(step_report=agent_pb2.StepReport(
                            generation=generation.number, rank=rank, step=step, step_time_s=1.0, compute_time_s=0.5,
                            param_digest=f"d{step}")))
                for agent in (new, old):
                    await agent.call.write(agent_pb2.AgentMessage(snapshot_holdings=holdings_pack.pack([
                        agent_pb2.SnapshotReport(generation=generation.number, rank=r, step=step, size_bytes=10,
                                                 sha256=f"s{r}") for r in holds[agent.node_id]])))
                await _until(lambda s=step: runtime.state.snapshot is not None and runtime.state.snapshot.step == s,
                             f"step {step} to commit")
                await new.acked(step)
                await old.acked(step)
            # n1: the generation's directive, then a notice per commit; n2: a directive per commit.
            def runs(agent: _Agent) -> list[int]:
                return [m.directive.retain_from_step for m in agent.received
                        if m.HasField("directive") and m.directive.action == agent_pb2.ACTION_RUN]

            assert runs(new) == [0]
            notices = [m.snapshot_retain for m in new.received if m.HasField("snapshot_retain")]
            assert [(n.generation, n.retain_from_step) for n in notices] == [(generation.number, 1), (generation.number, 2)]
            assert runs(old) == [0, 1, 2]
            assert not any(m.HasField("snapshot_retain") for m in old.received)
            # A push to every node afterwards sends n1 nothing: the notices moved its floor.
            sent_before = new.kinds().count("directive")
            runtime._push_directives()
            await new.acked(10)
            assert new.kinds().count("directive") == sent_before, "no directive resent for a floor the notices said"
        finally:
            for agent in (new, old):
                await agent.stop()


class _Notices(agent_pb2_grpc.SupervisorServicer):
    """A supervisor that welcomes, directs, then says retain floors (one of another generation)."""

    def __init__(self) -> None:
        self.hello = asyncio.get_running_loop().create_future()

    async def Connect(self, request_iterator, context):
        first = await anext(aiter(request_iterator))
        self.hello.set_result(first.hello)
        yield agent_pb2.SupervisorMessage(welcome=agent_pb2.Welcome(node_id="n0", heartbeat_interval_s=30))
        yield agent_pb2.SupervisorMessage(directive=agent_pb2.Directive(
            generation=3, action=agent_pb2.ACTION_RUN, ranks=[0, 1], buddy_node_id="n1", retain_from_step=4))
        for generation, step in ((3, 7), (2, 9), (3, 7), (3, 8)):
            yield agent_pb2.SupervisorMessage(snapshot_retain=agent_pb2.SnapshotRetain(
                generation=generation, retain_from_step=step))
        await asyncio.Event().wait()


async def test_the_link_hands_the_launcher_the_directive_a_notice_moved(tmp_path: pathlib.Path):
    fake = _Notices()
    server = grpc.aio.server()
    agent_pb2_grpc.add_SupervisorServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config_ = AgentConfig(node_id="n0", supervisors=(f"127.0.0.1:{port}",), role="active", host="127.0.0.1",
                          peer_port=9000, workdir=tmp_path, heartbeat_interval_s=30, gpus=8, log_json=None,
                          log_level="warning")
    handed: list[agent_pb2.Directive] = []
    link = SupervisorLink(config_, incarnation=1, peer_port=9000, reports=Reports(), on_directive=handed.append,
                          running_generation=lambda: 3, log=structlog.get_logger(), rng=random.Random(0))
    task = asyncio.create_task(link.run())
    try:
        hello = await asyncio.wait_for(fake.hello, 10)
        assert hello.takes_snapshot_retain
        await _until(lambda: len(handed) >= 3, "the directive and the two notices that move its floor")
        # Another generation's notice and a repeat move nothing; each moved one is the whole directive.
        assert [d.retain_from_step for d in handed] == [4, 7, 8]
        for moved in handed[1:]:
            expected = agent_pb2.Directive()
            expected.CopyFrom(handed[0])
            expected.retain_from_step = moved.retain_from_step
            assert moved == expected
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(0)
