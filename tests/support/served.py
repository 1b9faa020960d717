"""A Runtime served to agents over real gRPC on loopback, for tests that speak the agent protocol
to it: its loop runs, AgentService answers on an ephemeral port, and everything is torn down on
the way out (the loop cancelled and awaited, the server stopped)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server.agent_service import AgentService
from ftsup.v1 import agent_pb2_grpc


@contextlib.asynccontextmanager
async def served(runtime: Runtime) -> AsyncIterator[agent_pb2_grpc.SupervisorStub]:
    loop = asyncio.create_task(runtime.run())
    server = grpc.aio.server()
    agent_pb2_grpc.add_SupervisorServicer_to_server(AgentService(runtime), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield agent_pb2_grpc.SupervisorStub(channel)
    finally:
        await channel.close()
        await server.stop(0)
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
