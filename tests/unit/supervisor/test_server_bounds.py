"""The supervisor server's bounds: Hello strings, the canonical node id, message size, RPC count.

The Hello checks are pure; the server bounds run a real gRPC server built by the same function
as `ftsup supervisor` (server_limits.make_server) on loopback, with a real AgentService.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ftsup.agent.config import ConfigError as AgentConfigError
from ftsup.agent.config import parse_config
from ftsup.common.node_id import node_id_problem
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server import server_limits
from ftsup.supervisor.server.agent_service import AgentService
from ftsup.supervisor.server.hello_checks import MAX_HOST_CHARS, hello_problem
from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2
from tests.support.builders import config


def hello(**fields: object) -> agent_pb2.Hello:
    base: dict[str, object] = {"node_id": "node-1", "incarnation": 7, "host": "10.0.0.1", "peer_port": 9000,
                               "role": events_pb2.NODE_ROLE_ACTIVE, "gpus": 8, "agent_version": "1.0"}
    base.update(fields)
    return agent_pb2.Hello(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("node_id", ["node-1", "gpu-a17.rack3", "n", "0", "a" * 63, "spare-00012"])
def test_canonical_node_ids_are_accepted(node_id):
    assert node_id_problem(node_id) is None


@pytest.mark.parametrize("node_id, why", [
    ("", "empty"), ("Node-1", "lowercase: 'node-1'"), ("node_1", "not canonical"), (".", "not canonical"),
    ("..", "not canonical"), ("a..b", "not canonical"), ("-a", "not canonical"), ("a-", "not canonical"),
    ("a/b", "not canonical"), ("a" * 64, "longer than 63"), ("nöde", "not canonical"),
])
def test_other_node_ids_are_refused_saying_why(node_id, why):
    problem = node_id_problem(node_id)
    assert problem is not None and why in problem


def test_a_hello_within_bounds_passes():
    assert hello_problem(hello()) is None
    assert hello_problem(hello(host="gpu-a17.example.com")) is None
    assert hello_problem(hello(host="fd00::17")) is None


@pytest.mark.parametrize("fields, why", [
    ({"node_id": "x" * 1_000_000}, "longer than 63"),
    ({"host": ""}, "no host"),
    ({"host": "h" * (MAX_HOST_CHARS + 1)}, "longer than 253"),
    ({"host": "evil host; rm -rf"}, "neither a host name nor an IP"),
    ({"host": "a_b.example"}, "neither a host name nor an IP"),
    ({"agent_version": "v" * 65}, "agent_version of 65 characters"),
    ({"failure_domain": "rack 1"}, "spaces or control characters"),
    ({"failure_domain": "r" * 129}, "failure_domain of 129"),
    ({"gpus": 100_000}, "more than 1024"),
])
def test_a_hello_out_of_bounds_is_refused_saying_which_field(fields, why):
    problem = hello_problem(hello(**fields))
    assert problem is not None and why in problem
    assert len(problem) < 300, "the reason never echoes unbounded text"


def test_the_agent_refuses_a_non_canonical_node_id_at_start():
    with pytest.raises(AgentConfigError, match="--node-id: node id 'Node_1' is not canonical"):
        parse_config(["--node-id", "Node_1", "--supervisor", "127.0.0.1:7070"], environ={})


@pytest.fixture
async def bounded_server():
    runtime = Runtime(config(nodes=2, ranks_per_node=1), MemoryLog(), tick_s=60.0)
    loop = asyncio.create_task(runtime.run())
    server = server_limits.make_server(max_concurrent_rpcs=2)
    agent_pb2_grpc.add_SupervisorServicer_to_server(AgentService(runtime), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)])
    yield agent_pb2_grpc.SupervisorStub(channel)
    await channel.close()
    await server.stop(0)
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)


async def test_a_hello_with_an_oversized_node_id_is_refused_permanently_on_the_wire(bounded_server):
    call = bounded_server.Connect()
    await call.write(agent_pb2.AgentMessage(hello=hello(node_id="N" * 100_000)))
    answer = await call.read()
    assert answer.refusal.kind == agent_pb2.REFUSAL_KIND_PERMANENT and answer.refusal.ends_stream
    assert "longer than 63" in answer.refusal.reason and len(answer.refusal.reason) < 300


async def test_a_message_over_the_receive_limit_is_refused_naming_the_sizes(bounded_server):
    call = bounded_server.Connect()
    await call.write(agent_pb2.AgentMessage(hello=hello(agent_version="v" * (server_limits.MAX_RECEIVE_BYTES + 1))))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"vs. {server_limits.MAX_RECEIVE_BYTES})" in (refused.value.details() or "")


async def test_calls_beyond_the_concurrent_rpc_limit_are_refused_and_served_again_after(bounded_server):
    held = []
    for node in ("node-1", "node-2"):
        call = bounded_server.Connect()
        await call.write(agent_pb2.AgentMessage(hello=hello(node_id=node, incarnation=len(held) + 1)))
        assert (await call.read()).WhichOneof("kind") == "welcome"
        held.append(call)
    extra = bounded_server.Connect()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await extra.read()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Concurrent RPC limit exceeded" in (refused.value.details() or "")
    held.pop().cancel()
    again = bounded_server.Connect()
    deadline = asyncio.get_running_loop().time() + 10.0
    while True:  # the cancelled call's slot is released once the server has seen it end
        try:
            # (a refused call may already have its status when we write: the write raises it)
            await again.write(agent_pb2.AgentMessage(hello=hello(node_id="node-2", incarnation=9)))
            assert (await again.read()).WhichOneof("kind") in {"welcome", "refusal"}
            break
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert asyncio.get_running_loop().time() < deadline, "the slot was never released"
            again = bounded_server.Connect()
            await asyncio.sleep(0.05)


def test_the_default_rpc_limit_covers_every_agent_twice_and_operators():
    assert server_limits.default_max_concurrent_rpcs(12_500) == 2 * 12_500 + server_limits.OPERATOR_ROOM
    with pytest.raises(ValueError, match="max_concurrent_rpcs must be >= 1"):
        server_limits.make_server(0)


@pytest.mark.parametrize("flag, value, why", [
    ("--host", "my host", "--host: host 'my host' is neither a host name nor an IP address"),
    ("--failure-domain", "rack 7", "--failure-domain: failure domain 'rack 7' has spaces"),
])
def test_the_agent_refuses_hello_fields_the_supervisor_would_refuse_at_start(flag, value, why):
    with pytest.raises(AgentConfigError, match=why):
        parse_config(["--node-id", "node-1", "--supervisor", "127.0.0.1:7070", flag, value], environ={})
