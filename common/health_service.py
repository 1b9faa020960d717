"""The standard gRPC health service (grpc.health.v1) on an aio server, for both daemons.

The supervisor reports each of its services by role; the agent, its peer service. grpc_health
serves asyncio servers through `health.aio.HealthServicer`, which grpc_health-stubs do not
declare: this module is the one place that reaches it, and hands back the little the daemons use
(`set`, `enter_graceful_shutdown`) typed as a Protocol.
"""

from __future__ import annotations

from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


class HealthService(Protocol):
    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        """Sets `service`'s status ("" is the server as a whole); watchers hear the change."""

    async def enter_graceful_shutdown(self) -> None:
        """NOT_SERVING for every service from now on, whatever `set` says later."""


def serve_health(server: grpc.aio.Server) -> HealthService:
    """Adds the health service to `server` and returns it; nothing is SERVING until set."""
    servicer: HealthService = health.aio.HealthServicer()  # type: ignore[attr-defined]  # missing from grpc_health-stubs
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer
