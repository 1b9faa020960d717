"""The agents' stream service keeps every queue bounded and answers Hellos with typed refusals.

A real AgentService over a real Runtime (memory log) on a loopback gRPC port, driven by a raw
gRPC client that misbehaves: it floods, and never reads what the supervisor sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import pytest

from ftsup.harness.cluster import wait_until
from ftsup.supervisor.core.events import Event, Record
from ftsup.supervisor.eventlog.api import LogUnavailable
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server import agent_service
from ftsup.supervisor.server.agent_service import AgentService, StreamLimits
from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2
from tests.support.builders import config

LIMITS = StreamLimits(messages_per_s=100.0, message_burst=400.0, refusals_per_s=10.0, refusal_burst=50.0,
                      max_in_flight=16, outbox_capacity=32)


class FullLog(MemoryLog):
    """Appends fail while `is_full` (a full disk, etcd without quorum)."""

    def __init__(self) -> None:
        super().__init__()
        self.is_full = False

    async def append(self, events: Sequence[Event], **kwargs: object) -> list[Record]:
        if self.is_full:
            raise LogUnavailable("No space left on device")
        return await super().append(events, **kwargs)  # type: ignore[arg-type]


class Recording(StreamOutbox):
    """An outbox that remembers the most it ever held."""

    biggest = 0

    def put(self, message: agent_pb2.SupervisorMessage) -> bool:
        accepted = super().put(message)
        Recording.biggest = max(Recording.biggest, len(self))
        return accepted


@pytest.fixture
async def served(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(agent_service, "StreamOutbox", Recording)
    Recording.biggest = 0
    log = FullLog()
    runtime = Runtime(config(nodes=1, ranks_per_node=1), log, tick_s=60.0)
    loop = asyncio.create_task(runtime.run())
    server = grpc.aio.server()
    service = AgentService(runtime, limits=LIMITS)
    agent_pb2_grpc.add_SupervisorServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield runtime, log, agent_pb2_grpc.SupervisorStub(channel), loop, service
    await channel.close()
    await server.stop(0)
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)


def hello(node_id: str = "n1") -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id=node_id, incarnation=7, host="127.0.0.1",
                                                        peer_port=9000, role=events_pb2.NODE_ROLE_ACTIVE))


async def first_answer(stub: agent_pb2_grpc.SupervisorStub) -> agent_pb2.SupervisorMessage:
    call = stub.Connect()
    await call.write(hello())
    answer = await call.read()
    call.cancel()
    return answer


async def test_a_hello_the_supervisor_cannot_decide_now_is_refused_as_retryable(served):  # type: ignore[no-untyped-def]
    _, log, stub, _, _ = served
    log.is_full = True
    answer = await first_answer(stub)
    assert answer.WhichOneof("kind") == "refusal", answer
    assert answer.refusal.kind == agent_pb2.REFUSAL_KIND_RETRYABLE and answer.refusal.ends_stream
    assert "No space left on device" in answer.refusal.reason
    log.is_full = False
    assert (await first_answer(stub)).WhichOneof("kind") == "welcome"


async def test_an_invalid_node_id_is_refused_as_permanent(served):  # type: ignore[no-untyped-def]
    _, _, stub, _, service = served
    call = stub.Connect()
    await call.write(hello("bad/id"))
    answer = await call.read()
    assert answer.refusal.kind == agent_pb2.REFUSAL_KIND_PERMANENT and answer.refusal.ends_stream


async def flood(call: grpc.aio.StreamStreamCall, message: agent_pb2.AgentMessage, count: int) -> None:
    try:
        for _ in range(count):
            if call.done():  # the supervisor ended the stream: its status is in
                return
            await call.write(message)
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # the supervisor closed the stream


async def test_a_stream_flooding_refused_messages_is_closed_and_its_outbox_stays_bounded(served):  # type: ignore[no-untyped-def]
    runtime, _, stub, _, service = served
    call = stub.Connect()
    await call.write(hello())
    writer = asyncio.create_task(flood(call, agent_pb2.AgentMessage(), 5_000))  # empty: each one refused
    # The client never reads: refusals pile up on the supervisor's side until a limit closes the stream.
    await writer
    await call.code()  # the call ended (the client may see its own failed write rather than the status)
    assert [r.split(" (")[0] for r in service.limit_closures] == ["too many refused messages"]
    assert 0 < Recording.biggest <= LIMITS.outbox_capacity
    assert runtime.queued() <= LIMITS.max_in_flight


async def test_a_stream_flooding_valid_messages_is_rate_limited_and_queues_stay_bounded(served):  # type: ignore[no-untyped-def]
    runtime, _, stub, loop, _ = served
    call = stub.Connect()
    await call.write(hello())
    assert (await call.read()).WhichOneof("kind") == "welcome"
    loop.cancel()  # the supervisor's loop stalls: nothing drains the input queue
    await asyncio.gather(loop, return_exceptions=True)
    beat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1))
    writer = asyncio.create_task(flood(call, beat, 2_000))
    await asyncio.to_thread(wait_until, lambda: runtime.queued() >= LIMITS.max_in_flight, 10.0,
                            "the stream's in-flight inputs to fill")
    assert runtime.queued() == LIMITS.max_in_flight  # the reader waits; gRPC flow control holds the rest
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)


async def test_a_stream_over_its_message_rate_is_closed_with_resource_exhausted(served):  # type: ignore[no-untyped-def]
    _, _, stub, _, service = served
    call = stub.Connect()
    await call.write(hello())
    assert (await call.read()).WhichOneof("kind") == "welcome"
    beat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1))
    await flood(call, beat, 2_000)
    await call.code()
    assert len(service.limit_closures) == 1 and service.limit_closures[0].startswith("flooding: more than 100")
