"""`ftsup supervisor`: wires the event log, the runtime and the gRPC servers, then serves."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
import signal
import sys

import grpc
import structlog

from ftsup.v1 import agent_pb2_grpc, operator_pb2_grpc
from supervisor import logs
from supervisor.config import ConfigError, SupervisorConfig, from_args, parser
from supervisor.eventlog.api import LogError
from supervisor.eventlog.embedded import EmbeddedLog
from supervisor.eventlog.etcd import EtcdLog, make_client
from supervisor.leader import LeaderElection
from supervisor.replica import run_replica
from supervisor.runtime import Runtime
from supervisor.server.agent_service import AgentService
from supervisor.server.authz import Authorizer, is_loopback_only
from supervisor.server.operator_service import OperatorService


async def serve(config: SupervisorConfig) -> None:
    log = logs.get("supervisor")
    replicated = None
    if config.etcd_endpoints:
        replicated = await open_replicated(config)
        election, event_log, client = replicated
    else:
        event_log = open_embedded(config, log)
    runtime = Runtime(config.core, event_log, tick_s=config.tick_s, snapshot_every=config.snapshot_every)
    server = grpc.aio.server()
    agent_pb2_grpc.add_SupervisorServicer_to_server(AgentService(runtime), server)
    authorizer = Authorizer(config.operator_token, is_loopback_only(config.listen))
    operator_pb2_grpc.add_OperatorServicer_to_server(OperatorService(runtime, config.advertise, authorizer), server)
    port = server.add_insecure_port(config.listen)
    if port == 0:
        raise ConfigError(f"cannot listen on {config.listen}")
    await server.start()
    job = config.core.job
    log.info("supervisor serving", listen=config.listen, advertise=config.advertise,
             log_backend=f"etcd {','.join(config.etcd_endpoints)} {config.etcd_prefix}" if replicated
             else f"embedded {config.data_dir}", job=job.name,
             nodes=job.nodes, ranks_per_node=job.ranks_per_node,
             heartbeat_interval_s=config.core.detector.heartbeat_interval_s,
             dead_after_s=config.core.detector.dead_after_s,
             reconnect_grace_s=config.core.detector.reconnect_grace_s,
             operator_commands="token" if config.operator_token else
             ("local only" if is_loopback_only(config.listen) else "disabled (no --operator-token-file)"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(runtime.run())]
    if replicated:
        tasks.append(asyncio.create_task(run_replica(runtime, election, event_log)))
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    await server.stop(grace=1.0)
    for task in (*tasks, stopper):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if replicated:
        with contextlib.suppress(Exception):
            await election.resign()
        await event_log.aclose()
        await client.close()
    else:
        event_log.close()
    for task in tasks:
        if task in done and not task.cancelled() and task.exception():
            raise task.exception()  # type: ignore[misc]
    log.info("supervisor stopped")


def open_embedded(config: SupervisorConfig, log: structlog.typing.FilteringBoundLogger) -> EmbeddedLog:
    event_log = EmbeddedLog(config.data_dir, segment_bytes=config.segment_bytes)
    if event_log.truncated_bytes:
        log.warning("torn tail truncated from the event log (a crash mid-append; nothing acknowledged"
                    " was lost)", bytes=event_log.truncated_bytes, segment=str(event_log.truncated_segment))
    for warning in event_log.snapshot_warnings:
        log.warning("event log snapshot", problem=warning)
    return event_log


async def open_replicated(config: SupervisorConfig) -> tuple[LeaderElection, EtcdLog, Any]:
    client = make_client(config.etcd_endpoints)
    election = LeaderElection(client, config.etcd_prefix, config.advertise, ttl_s=config.lease_ttl_s)
    try:
        event_log = await EtcdLog.open(client, config.etcd_prefix, fence_key=election.key)
    except Exception:
        await client.close()
        raise
    return election, event_log, client


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = from_args(args)
    except ConfigError as exc:
        print(f"ftsup supervisor: {exc}", file=sys.stderr)
        return 2
    logs.configure(json=config.log_json, level=config.log_level)
    try:
        asyncio.run(serve(config))
    except (ConfigError, LogError) as exc:
        print(f"ftsup supervisor: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
