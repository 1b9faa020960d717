"""`ftsup supervisor`: wires the event log, the runtime and the gRPC servers, then serves.

Also owns the daemon's contract with its host: systemd notifications (READY once gRPC is bound
and, when replicated, the follower loop runs; WATCHDOG from this event loop; STOPPING), the
standard gRPC health service, mTLS on the listener and the gRPC message limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Any

import structlog
from grpc_health.v1 import health_pb2

from ftsup.common import logs, tls
from ftsup.common.gc_pacing import GcPacer
from ftsup.common.health_service import HealthService, serve_health
from ftsup.common.metrics_http import MetricsListenError, serve_metrics
from ftsup.common.sdnotify import Notifier, pet_watchdog
from ftsup.supervisor.config import ConfigError, SupervisorConfig, load
from ftsup.supervisor.etcd_tls import make_tls_client, sync_channel_factory
from ftsup.supervisor.eventlog.api import EventLog, LogError
from ftsup.supervisor.eventlog.embedded import EmbeddedLog
from ftsup.supervisor.eventlog.etcd import EtcdLog, make_client
from ftsup.supervisor.leader import LeaderElection
from ftsup.supervisor.metrics import SupervisorMetrics
from ftsup.supervisor.replica import rehome_on_change, run_replica
from ftsup.supervisor.runtime import HELLO_BATCH, Runtime
from ftsup.supervisor.server import server_limits
from ftsup.supervisor.server.agent_service import AgentService
from ftsup.supervisor.server.authz import Authorizer, is_loopback_only
from ftsup.supervisor.server.log_relay import LogRelay
from ftsup.supervisor.server.operator_guard import guarded
from ftsup.supervisor.server.operator_service import OperatorService
from ftsup.supervisor.server.relay_service import RelayService
from ftsup.supervisor.shard import LinkShard
from ftsup.supervisor.shard_members import ReplicaMembers
from ftsup.supervisor.web.server import StatusListenError
from ftsup.v1 import agent_pb2, agent_pb2_grpc, operator_pb2, operator_pb2_grpc, shard_pb2_grpc

# The server's bounds live in supervisor/server/server_limits.py; these names stay for callers.
MAX_MESSAGE_BYTES = server_limits.MAX_RECEIVE_BYTES
SERVER_OPTIONS = server_limits.server_options()
AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["Supervisor"].full_name
OPERATOR_SERVICE = operator_pb2.DESCRIPTOR.services_by_name["Operator"].full_name
HEALTH_PERIOD_S = 0.5


async def track_health(runtime: Runtime, checker: HealthService, notifier: Notifier,
                       shard: LinkShard | None = None) -> None:
    """Keeps health and systemd STATUS in step with leadership.

    "" and the Operator service are SERVING on every replica (any replica answers reads); the
    agents' Supervisor service is SERVING on the leader and, with link shards, on a follower
    whose relay to the leader is up (it holds its share of the agents); otherwise NOT_SERVING,
    since such a follower only redirects agents.
    """
    was: tuple[bool, bool] | None = None
    while True:
        is_leader = runtime.is_leader
        is_relaying = shard is not None and not is_leader and shard.relay_up.is_set()
        if (is_leader, is_relaying) != was:
            serving = is_leader or is_relaying
            state = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
            await checker.set(AGENT_SERVICE, state)
            notifier.status(f"leader, term {runtime.term}" if is_leader
                            else f"follower (leader {runtime.leader_address or 'unknown'}"
                            + (", link shard relaying)" if is_relaying else ")"))
            was = is_leader, is_relaying
        await asyncio.sleep(HEALTH_PERIOD_S)


async def serve(config: SupervisorConfig, notifier: Notifier | None = None) -> None:
    log = logs.get("supervisor")
    notifier = notifier or Notifier.from_env()
    replicated = None
    embedded: EmbeddedLog | None = None
    event_log: EventLog
    if config.etcd_endpoints:
        replicated = await open_replicated(config)
        election, etcd_log, client = replicated
        event_log = etcd_log
    else:
        event_log = embedded = open_embedded(config, log)
    # One append of any size is one transaction on etcd too (a big one is stored as a span).
    runtime = Runtime(config.core, event_log, tick_s=config.tick_s, snapshot_every=config.snapshot_every,
                      hello_batch=HELLO_BATCH)
    if config.checkpoints.location:
        from ftsup.supervisor.checkpointer import Checkpointer

        runtime.checkpointer = Checkpointer(config.checkpoints, runtime.post)
    metrics_server = None
    if config.metrics_listen:
        runtime.metrics = SupervisorMetrics(config.throughput)
        runtime.metrics.attach(runtime)
        metrics_server = await serve_metrics(runtime.metrics.registry, config.metrics_listen, runtime.metrics.refresh,
                                             tls_files=config.server_tls)
    status_server = None
    if config.status_listen:
        from ftsup.supervisor.web.server import serve_status

        status_server = await serve_status(runtime, config.status_listen, tls_files=config.server_tls)
    server = server_limits.make_server(config.max_concurrent_rpcs
                                       or server_limits.default_max_concurrent_rpcs(config.core.job.nodes))
    is_tls = config.server_tls is not None
    members: ReplicaMembers | None = None
    shard: LinkShard | None = None
    if replicated and config.link_shards:
        # Link shards (issue 14): every replica holds its share of the agents; followers relay theirs.
        members = ReplicaMembers(client, config.etcd_prefix, config.advertise, ttl_s=config.lease_ttl_s,
                                 is_ready=lambda: runtime.is_leader or (shard is not None and shard.has_relayed),
                                 keepalive_channel=sync_channel_factory(config.etcd_endpoints, config.etcd_tls))
        shard = LinkShard(config.advertise, lambda: members.live if members else (), tls_files=config.server_tls,
                          generation=lambda: runtime.generation_in_force,
                          leader=lambda: config.advertise if runtime.is_leader else runtime.leader_address,
                          on_summary_admitted=runtime.metrics.shard_liveness_seconds.observe if runtime.metrics else None)
        shard_pb2_grpc.add_LinkShardServicer_to_server(RelayService(runtime, is_tls=is_tls), server)
    agent_service = AgentService(runtime, is_tls=is_tls, shard=shard)
    agent_pb2_grpc.add_SupervisorServicer_to_server(agent_service, server)
    authorizer = Authorizer(config.operator_token, is_loopback_only(config.listen),
                            read_token=config.operator_read_token, is_tls=is_tls)
    operator_pb2_grpc.add_OperatorServicer_to_server(
        guarded(OperatorService(runtime, config.advertise, runtime.metrics.goodput if runtime.metrics else None,
                                LogRelay(lambda: runtime.state, config.server_tls)), authorizer), server)
    checker = serve_health(server)
    await checker.set("", health_pb2.HealthCheckResponse.SERVING)
    await checker.set(OPERATOR_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    await checker.set(AGENT_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    if config.server_tls is not None:
        port = server.add_secure_port(config.listen, tls.server_credentials(config.server_tls))
    else:
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
             tls="mTLS" if is_tls else "off (plaintext)", operator_auth=authorizer.mode)
    if not is_tls and not tls.is_loopback(config.listen):
        log.warning("insecure mode", detail=tls.INSECURE_WARNING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(runtime.run())]
    if replicated:
        tasks.append(asyncio.create_task(run_replica(runtime, election, etcd_log, shard)))
    helpers = [asyncio.create_task(track_health(runtime, checker, notifier, shard)),
               asyncio.create_task(pet_watchdog(notifier))]
    if members is not None and shard is not None:
        helpers += [asyncio.create_task(members.run()),
                    asyncio.create_task(rehome_on_change(members, shard.rehome, agent_service.rehome))]
    pacer = _gc_pacer(config, runtime)
    helpers.append(asyncio.create_task(pacer.run()))
    await asyncio.sleep(0)  # let the runtime (and follower) tasks start before READY=1
    notifier.ready(f"serving on {config.listen}" + (" (replica, following)" if replicated else ""))
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    notifier.stopping()
    for helper in helpers:
        helper.cancel()
    await asyncio.gather(*helpers, return_exceptions=True)
    pacer.close()
    await checker.enter_graceful_shutdown()
    if shard is not None:
        shard.shutdown()  # its agents move to their next shards; the relay carries that during the grace
    await server.stop(grace=1.0)
    if metrics_server is not None:
        metrics_server.close()
    if status_server is not None:
        status_server.close()
    for task in (*tasks, stopper):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if replicated:
        with contextlib.suppress(Exception):
            await election.resign()
        await etcd_log.aclose()
        await client.close()
    elif embedded is not None:
        embedded.close()
    for task in tasks:
        if task in done and not task.cancelled() and (error := task.exception()) is not None:
            raise error
    log.info("supervisor stopped")


def _gc_pacer(config: SupervisorConfig, runtime: Runtime) -> GcPacer:
    """The collector's pauses in ftsup_gc_pause_seconds; full collections paced with --gc-refreeze-s
    (common/gc_pacing.py)."""

    def on_pause(generation: int, seconds: float) -> None:
        if runtime.metrics is not None:
            runtime.metrics.gc_pause_seconds.labels(str(generation)).observe(seconds)

    pacer = GcPacer(refreeze_s=config.gc_refreeze_s, on_pause=on_pause)
    pacer.install()
    return pacer


def open_embedded(config: SupervisorConfig, log: structlog.typing.FilteringBoundLogger) -> EmbeddedLog:
    event_log = EmbeddedLog(config.data_dir, segment_bytes=config.segment_bytes)
    if event_log.truncated_bytes:
        log.warning("torn tail truncated from the event log (a crash mid-append; nothing acknowledged"
                    " was lost)", bytes=event_log.truncated_bytes, segment=str(event_log.truncated_segment))
    for warning in event_log.snapshot_warnings:
        log.warning("event log snapshot", problem=warning)
    return event_log


async def open_replicated(config: SupervisorConfig) -> tuple[LeaderElection, EtcdLog, Any]:
    if config.etcd_tls is not None:
        client = make_tls_client(config.etcd_endpoints, config.etcd_tls)
    else:
        client = make_client(config.etcd_endpoints)
    election = LeaderElection(client, config.etcd_prefix, config.advertise, ttl_s=config.lease_ttl_s,
                              keepalive_channel=sync_channel_factory(config.etcd_endpoints, config.etcd_tls))
    try:
        event_log = await EtcdLog.open(client, config.etcd_prefix, fence_key=election.key)
    except Exception:
        await client.close()
        raise
    return election, event_log, client


def main(argv: list[str] | None = None) -> int:
    try:
        config = load(argv)
    except ConfigError as exc:
        print(f"ftsup supervisor: {exc}", file=sys.stderr)
        return 2
    logs.configure(json=config.log_json, level=config.log_level)
    try:
        asyncio.run(serve(config))
    except (ConfigError, LogError, tls.TlsConfigError, MetricsListenError, StatusListenError) as exc:
        print(f"ftsup supervisor: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
