"""The daemons' health service (common/health_service.py) answers the standard Check: a service
never set is NOT_FOUND, a set status is served, and a graceful shutdown turns everything NOT_SERVING."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ftsup.common.health_service import serve_health

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def test_a_set_status_is_served_until_the_graceful_shutdown() -> None:
    server = grpc.aio.server()
    checker = serve_health(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await checker.set("", SERVING)
        await checker.set("ftsup.v1.AgentPeer", SERVING)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def status(service: str) -> int:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                return int(reply.status)

            assert await status("") == SERVING and await status("ftsup.v1.AgentPeer") == SERVING
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await status("ftsup.v1.Nothing")
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
            await checker.enter_graceful_shutdown()
            assert await status("") == NOT_SERVING and await status("ftsup.v1.AgentPeer") == NOT_SERVING
    finally:
        await server.stop(None)
