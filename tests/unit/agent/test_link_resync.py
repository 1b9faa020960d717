"""A new session's resync (the snapshots a node holds, sent again to a possibly new leader) waits
for the Welcome and goes as one SnapshotHoldings per step where the supervisor takes them, one
SnapshotReport each where it does not; heartbeats do not wait for it."""

from __future__ import annotations

import asyncio
import pathlib
import random

import grpc
import pytest
import structlog

from ftsup.agent.config import AgentConfig
from ftsup.agent.link import Reports, SupervisorLink, fold_holdings
from ftsup.v1 import agent_pb2, agent_pb2_grpc


def held(rank: int, step: int) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(snapshot_report=agent_pb2.SnapshotReport(
        generation=1, rank=rank, step=step, holder_node_ids=["n0"], size_bytes=10, sha256=f"s{rank}"))


def test_resync_holdings_fold_per_step_and_everything_else_keeps_its_place():
    answer = agent_pb2.AgentMessage(sdc_check_result=agent_pb2.SdcCheckResult(check_id="c"))
    folded = fold_holdings([held(0, 7), held(1, 8), held(1, 7), answer, held(2, 7), held(2, 9)])
    assert [m.WhichOneof("kind") for m in folded] == ["snapshot_holdings", "snapshot_report", "sdc_check_result",
                                                      "snapshot_report"]
    assert (folded[0].snapshot_holdings.step, list(folded[0].snapshot_holdings.ranks)) == (7, [0, 1, 2])
    assert [folded[1].snapshot_report.step, folded[3].snapshot_report.step] == [8, 9]


class _Supervisor(agent_pb2_grpc.SupervisorServicer):
    def __init__(self, takes_holdings: bool) -> None:
        self.takes_holdings = takes_holdings
        self.received: list[agent_pb2.AgentMessage] = []
        self.welcome = asyncio.Event()  # the test says when the Welcome goes

    async def Connect(self, request_iterator, context):
        async def read() -> None:
            async for message in request_iterator:
                self.received.append(message)

        reader = asyncio.create_task(read())
        await self.welcome.wait()
        yield agent_pb2.SupervisorMessage(welcome=agent_pb2.Welcome(
            node_id="n0", heartbeat_interval_s=0.05, takes_snapshot_holdings=self.takes_holdings))
        await reader


@pytest.mark.parametrize("takes_holdings", [True, False])
async def test_the_resync_waits_for_the_welcome_and_folds_only_when_told(tmp_path: pathlib.Path, takes_holdings):
    fake = _Supervisor(takes_holdings)
    server = grpc.aio.server()
    agent_pb2_grpc.add_SupervisorServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config = AgentConfig(node_id="n0", supervisors=(f"127.0.0.1:{port}",), role="active", host="127.0.0.1",
                         peer_port=9000, workdir=tmp_path, heartbeat_interval_s=0.05, gpus=8, log_json=None,
                         log_level="warning")
    link = SupervisorLink(config, incarnation=1, peer_port=9000, reports=Reports(), on_directive=lambda d: None,
                          running_generation=lambda: 1, log=structlog.get_logger(), rng=random.Random(0),
                          resync=lambda: [held(0, 7), held(1, 7)])
    task = asyncio.create_task(link.run())
    try:
        deadline = asyncio.get_running_loop().time() + 5.0
        while sum(m.WhichOneof("kind") == "heartbeat" for m in fake.received) < 2:
            assert asyncio.get_running_loop().time() < deadline, "heartbeats before the Welcome"
            await asyncio.sleep(0.01)
        assert not any(m.WhichOneof("kind").startswith("snapshot") for m in fake.received), "no resync yet"
        fake.welcome.set()
        while not any(m.WhichOneof("kind").startswith("snapshot") for m in fake.received):
            assert asyncio.get_running_loop().time() < deadline, "the resync after the Welcome"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        kinds = [m.WhichOneof("kind") for m in fake.received if m.WhichOneof("kind").startswith("snapshot")]
        assert kinds == (["snapshot_holdings"] if takes_holdings else ["snapshot_report", "snapshot_report"])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(0)


class _TwoLeaders(agent_pb2_grpc.SupervisorServicer):
    """One stream, two Welcomes: what an agent sees when its link shard keeps its stream across a
    leader change and the new leader welcomes the replayed Hello."""

    def __init__(self) -> None:
        self.received: list[agent_pb2.AgentMessage] = []
        self.second = asyncio.Event()  # the test says when the new leader's Welcome goes
        self.streams = 0

    async def Connect(self, request_iterator, context):
        self.streams += 1

        async def read() -> None:
            async for message in request_iterator:
                self.received.append(message)

        reader = asyncio.create_task(read())
        yield agent_pb2.SupervisorMessage(welcome=agent_pb2.Welcome(node_id="n0", heartbeat_interval_s=30, term=1))
        await self.second.wait()
        yield agent_pb2.SupervisorMessage(welcome=agent_pb2.Welcome(node_id="n0", heartbeat_interval_s=30, term=2))
        await reader


async def test_a_second_welcome_on_the_same_stream_brings_the_resync_again_at_once(tmp_path: pathlib.Path):
    fake = _TwoLeaders()
    server = grpc.aio.server()
    agent_pb2_grpc.add_SupervisorServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config = AgentConfig(node_id="n0", supervisors=(f"127.0.0.1:{port}",), role="active", host="127.0.0.1",
                         peer_port=9000, workdir=tmp_path, heartbeat_interval_s=30, gpus=8, log_json=None,
                         log_level="warning")
    reports = Reports()
    reports.send(agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(generation=1, rank=0)), sticky=True)
    link = SupervisorLink(config, incarnation=1, peer_port=9000, reports=reports, on_directive=lambda d: None,
                          running_generation=lambda: 1, log=structlog.get_logger(), rng=random.Random(0),
                          resync=lambda: [held(0, 7)])

    def resyncs() -> int:
        return sum(m.WhichOneof("kind") == "snapshot_report" for m in fake.received)

    def exits() -> int:
        return sum(m.WhichOneof("kind") == "trainer_exit" for m in fake.received)

    async def until(what: str, predicate) -> None:
        deadline = asyncio.get_running_loop().time() + 5.0
        while not predicate():
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.01)

    task = asyncio.create_task(link.run())
    try:
        # The first session: the resync (a holding, then the sticky fact) and the queued report.
        await until("the first resync and the queued report", lambda: resyncs() == 1 and exits() == 2)
        assert fake.received[0].hello.resyncs_on_welcome, "the Hello says a shard may keep this stream"
        fake.second.set()
        # Heartbeats are 30 s apart: the resync must not wait for the next one.
        await until("the resync after the second Welcome, sticky facts too", lambda: resyncs() == 2 and exits() == 3)
        assert fake.streams == 1, "no reconnect"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop(0)
