"""`ftsup supervisor`: wires the event log, the runtime and the gRPC servers, then serves."""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc

from ftsup.v1 import agent_pb2_grpc, operator_pb2_grpc
from supervisor import logs
from supervisor.config import ConfigError, SupervisorConfig, from_args, parser
from supervisor.eventlog.api import LogError
from supervisor.eventlog.embedded import EmbeddedLog
from supervisor.runtime import Runtime
from supervisor.server.agent_service import AgentService
from supervisor.server.authz import Authorizer, is_loopback_only
from supervisor.server.operator_service import OperatorService


async def serve(config: SupervisorConfig) -> None:
    log = logs.get("supervisor")
    event_log = EmbeddedLog(config.data_dir, segment_bytes=config.segment_bytes)
    if event_log.truncated_bytes:
        log.warning("torn tail truncated from the event log (a crash mid-append; nothing acknowledged"
                    " was lost)", bytes=event_log.truncated_bytes, segment=str(event_log.truncated_segment))
    runtime = Runtime(config.core, event_log, tick_s=config.tick_s, snapshot_every=config.snapshot_every)
    for warning in event_log.snapshot_warnings:
        log.warning("event log snapshot", problem=warning)
    server = grpc.aio.server()
    agent_pb2_grpc.add_SupervisorServicer_to_server(AgentService(runtime), server)
    authorizer = Authorizer(config.operator_token, is_loopback_only(config.listen))
    operator_pb2_grpc.add_OperatorServicer_to_server(OperatorService(runtime, config.listen, authorizer), server)
    port = server.add_insecure_port(config.listen)
    if port == 0:
        raise ConfigError(f"cannot listen on {config.listen}")
    await server.start()
    job = config.core.job
    log.info("supervisor serving", listen=config.listen, data_dir=str(config.data_dir), job=job.name,
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
    loop_task = asyncio.create_task(runtime.run())
    await asyncio.wait([loop_task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    await server.stop(grace=1.0)
    loop_task.cancel()
    event_log.close()
    if loop_task.done() and not loop_task.cancelled() and loop_task.exception():
        raise loop_task.exception()  # type: ignore[misc]
    log.info("supervisor stopped")


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
