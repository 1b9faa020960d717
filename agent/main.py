"""`ftsup agent`: parses the config, wires the agent's parts, runs until a signal or a refusal.

Exit codes: 0 after SIGTERM/SIGINT (trainers stopped), 1 for an unexpected failure, 2 for a bad
command line or configuration, 3 when the supervisor refused this node for good (a PERMANENT
Hello refusal: duplicate or unknown node id, a certificate naming another node; restarting cannot
fix it, so the unit's RestartPreventExitStatus= names 2 and 3). A RETRYABLE refusal (the
supervisor cannot decide now) never exits: the link retries while the trainers go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import random
import signal
import sys
from collections.abc import AsyncIterator

import grpc
import structlog
from grpc_health.v1 import health_pb2

from ftsup.agent.codec import holding_report, snapshot_memory_report
from ftsup.agent.config import AgentConfig, ConfigError, parse_config
from ftsup.agent.core.snapshot_budget import SnapshotBudget
from ftsup.agent.grpc_options import MESSAGE_OPTIONS
from ftsup.agent.launcher import STOP_GRACE_S, Launcher
from ftsup.agent.link import HelloRefused, Reports, SupervisorLink, new_incarnation
from ftsup.agent.log_tail import LogTailer
from ftsup.agent.metrics import AgentCollector, agent_registry
from ftsup.agent.peer_auth import PeerAuthority
from ftsup.agent.peer_service import PeerService
from ftsup.agent.peers import PeerClient
from ftsup.agent.process import AsyncioProcessRunner, default_base_env, drop_ambient_capabilities
from ftsup.agent.progress import ProgressTracker
from ftsup.agent.restore import RestoreBook
from ftsup.agent.sdc_check import SdcChecker
from ftsup.agent.snapshots import SnapshotStore
from ftsup.agent.streams import add_peer_service, add_trainer_link
from ftsup.agent.trainer_api import TrainerLinkService
from ftsup.agent.warm_pool import WarmPoolRunner
from ftsup.agent.watchers import follow_file, follow_kmsg, gpu_index_by_pci, watch_hangs, watch_xids
from ftsup.common import logs, tls
from ftsup.common.health_service import serve_health
from ftsup.common.metrics_http import MetricsListenError, serve_metrics
from ftsup.common.sdnotify import Notifier, pet_watchdog
from ftsup.v1 import agent_pb2, peer_pb2

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad flags or configuration
EXIT_REFUSED = 3  # the supervisor refused this node for good (a PERMANENT Hello refusal)


PEER_SERVICE = peer_pb2.DESCRIPTOR.services_by_name["AgentPeer"].full_name


async def run_agent(config: AgentConfig) -> int:
    rng = random.SystemRandom()
    incarnation = new_incarnation(rng)
    # Every line names this node and the generation it runs (null while none runs): read per line,
    # since one logger serves the agent's whole life. Lines about a given generation pass their own.
    generation_now = logs.Live(lambda: None)
    log = logs.get("agent", node_id=config.node_id, incarnation=incarnation, generation=generation_now)
    log.info("agent_starting", **config.effective())
    if config.tls_files is None and not tls.is_loopback(f"{config.host}:0"):
        log.warning("insecure_mode", detail=tls.INSECURE_WARNING)
    config.workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        config.socket_path.unlink()  # a stale socket from a previous agent process

    reports = Reports()

    def announce_budget(budget: SnapshotBudget) -> None:
        """Logged, and told the supervisor (`supervisorctl nodes`): sticky, so every new session hears it."""
        log.info("snapshot_memory_limit", limit_bytes=budget.limit_bytes, basis=budget.basis.value,
                 derived_bytes=budget.derived_bytes, ranks=budget.ranks, reason=budget.reason)
        reports.send(snapshot_memory_report(budget), sticky=True)

    store = SnapshotStore(memory_limit_bytes=config.snapshot_memory_bytes, on_budget=announce_budget)
    announce_budget(store.budget)
    files = config.tls_files
    peers = PeerClient(random.Random(rng.getrandbits(64)),
                       credentials=tls.channel_credentials(files) if files is not None else None,
                       node_id=config.node_id)
    restores = RestoreBook(config.node_id, store, peers, log.bind(part="restore"))
    process_runner = AsyncioProcessRunner(nice=config.trainer_nice)
    runner: AsyncioProcessRunner | WarmPoolRunner = process_runner
    if config.warm_trainers:
        runner = WarmPoolRunner(process_runner, config.warm_trainers, config.workdir, log.bind(part="warm_pool"),
                                nice=config.trainer_nice)
        await runner.start()
    launcher = Launcher(
        config, runner, store, restores, reports.send, default_base_env(), log.bind(part="launcher")
    )
    generation_now.read = lambda: launcher.running_generation() or None
    # SDC recomputes this node runs as a verifier: the plain runner (a replay is not a warm trainer).
    sdc = SdcChecker(config.node_id, config.workdir, store, peers, AsyncioProcessRunner(nice=config.trainer_nice),
                         default_base_env(), reports.send, log.bind(part="sdc"))

    progress = ProgressTracker()
    # Peer authorization: each directive says who may store and fetch which ranks here.
    authority = PeerAuthority(config.node_id, lambda: max((p.last_step for p in progress.ranks.values()), default=0))
    peer_server = grpc.aio.server(options=MESSAGE_OPTIONS)
    add_peer_service(
        PeerService(config.node_id, store, reports, log.bind(part="peer"), authority, is_tls=files is not None,
                    logs=LogTailer(config.node_id, config.workdir, launcher.is_writing)),
        peer_server)
    # The standard health service on the peer port: SERVING while this agent serves its peers.
    checker = serve_health(peer_server)
    await checker.set("", health_pb2.HealthCheckResponse.SERVING)
    await checker.set(PEER_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    # Bound to the advertised host only: snapshots hold the model, so the peer service is not
    # exposed on every interface; beyond loopback it needs mTLS (or --insecure, checked in config).
    peer_address = f"{config.host}:{config.peer_port}"
    peer_port = (peer_server.add_secure_port(peer_address, tls.server_credentials(files)) if files is not None
                 else peer_server.add_insecure_port(peer_address))
    if peer_port == 0:
        log.error("peer_port_unavailable", host=config.host, peer_port=config.peer_port)
        return EXIT_FAILURE
    trainer_server = grpc.aio.server(options=MESSAGE_OPTIONS)
    trainer_service = TrainerLinkService(
        config.node_id, launcher, store, restores, peers, reports, log.bind(part="trainer_link"), progress
    )
    add_trainer_link(trainer_service, trainer_server)
    await peer_server.start()
    await start_private_unix_server(trainer_server, config.socket_path)
    log.info("agent_listening", peer_port=peer_port, trainer_link=config.trainer_link_address)

    # One task owns the launcher: directives are applied in arrival order, never concurrently.
    directives: asyncio.Queue[agent_pb2.Directive] = asyncio.Queue()

    async def apply_directives() -> None:
        while True:
            directive = await directives.get()
            try:
                authority.apply(directive)
                grants = authority.grants  # the store makes room for its own and its buddies' ranks
                store.expect_ranks(grants.own_ranks.union(*grants.stores.values()))
                sdc.apply(directive.sdc_checks)
                await launcher.apply(directive)
                reports.forget_sticky_before(directive.generation)
            except Exception:
                log.exception("directive_failed", generation=directive.generation)

    def holdings() -> list[agent_pb2.AgentMessage]:
        """Every snapshot of the running generation this node holds, for a (new) supervisor."""
        generation = launcher.running_generation()
        blobs = (store.get(rank, step) for rank, step in store.keys())
        held = [holding_report(b, config.node_id) for b in blobs if b is not None and b.generation == generation]
        return held + sdc.resync()  # answers to SDC checks still open

    link = SupervisorLink(
        config,
        incarnation=incarnation,
        peer_port=peer_port,
        reports=reports,
        on_directive=directives.put_nowait,
        running_generation=launcher.running_generation,
        local_ranks=lambda: len(launcher.run.ranks) if launcher.run is not None else 1,
        log=log.bind(part="link"),
        rng=random.Random(rng.getrandbits(64)),
        resync=holdings,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    watchers = [asyncio.create_task(watch_hangs(progress, launcher.running, reports.send, config.hang,
                                                log.bind(part="hang")))]
    xid_lines = open_xid_source(config.xid_log, log)
    if xid_lines is not None:
        lines, source = xid_lines
        watchers.append(asyncio.create_task(watch_xids(lines, source, gpu_index_by_pci(), reports.send,
                                                       log.bind(part="xid"))))
    metrics_server = None
    if config.metrics_listen:
        collector = AgentCollector(config.node_id, store, launcher.running, progress, reports,
                                   runner.idle if isinstance(runner, WarmPoolRunner) else None)
        metrics_server = await serve_metrics(agent_registry(collector), config.metrics_listen, tls_files=files)
    link_task = asyncio.create_task(link.run())
    applier = asyncio.create_task(apply_directives())
    stopper = asyncio.create_task(stop.wait())
    notifier = Notifier.from_env()
    watchers.append(asyncio.create_task(pet_watchdog(notifier)))
    # READY once the peer and trainer endpoints serve and the link is connecting: the trainers and
    # peers can reach this agent even while the supervisor is away.
    notifier.ready(f"node {config.node_id}: peer port {peer_port}, connecting to {','.join(config.supervisors)}")
    code = EXIT_OK
    try:
        await asyncio.wait({link_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if link_task.done():
            exc = link_task.exception()
            if isinstance(exc, HelloRefused):
                print(f"ftsup agent {config.node_id}: the supervisor refused to admit this node: {exc}", file=sys.stderr)
                log.error("hello_refused", reason=str(exc))
                code = EXIT_REFUSED
            else:
                log.error("link_failed", error=repr(exc))
                code = EXIT_FAILURE
        else:
            log.info("agent_stopping", reason="signal")
    finally:
        notifier.stopping()
        await checker.enter_graceful_shutdown()
        for task in (applier, *watchers):
            task.cancel()
        await asyncio.gather(applier, *watchers, return_exceptions=True)
        await launcher.stop(STOP_GRACE_S)
        await sdc.close()
        if isinstance(runner, WarmPoolRunner):
            await runner.close()
        link_task.cancel()
        stopper.cancel()
        await asyncio.gather(link_task, stopper, return_exceptions=True)
        await trainer_server.stop(0.5)
        await peer_server.stop(0.5)
        if metrics_server is not None:
            metrics_server.close()
        await peers.close()
        with contextlib.suppress(FileNotFoundError):
            config.socket_path.unlink()
        log.info("agent_stopped", exit_code=code, reports_unsent=len(reports), reports_dropped=reports.dropped)
    return code


async def start_private_unix_server(server: grpc.aio.Server, path: pathlib.Path) -> None:
    """Serves `server` on the Unix socket `path`, connectable by this user alone (mode 0600)
    whatever the umask: the trainer link hands out snapshots and takes step reports, so only the
    agent's own trainers (same user) may reach it. The umask covers the moment between bind and
    chmod; the chmod is what holds."""
    server.add_insecure_port(f"unix:{path}")
    previous = os.umask(0o077)
    try:
        await server.start()
    finally:
        os.umask(previous)
    os.chmod(path, 0o600)


def open_xid_source(setting: str, log: structlog.typing.FilteringBoundLogger) -> tuple[AsyncIterator[str], str] | None:
    """The kernel-log line stream to watch for Xids, from --xid-log; None when there is none."""
    if setting == "none":
        return None
    kmsg = pathlib.Path("/dev/kmsg")
    if setting == "auto":
        if not os.access(kmsg, os.R_OK):
            log.warning("xid_watch_off", reason="/dev/kmsg is not readable; pass --xid-log FILE (e.g. kern.log)")
            return None
        setting = str(kmsg)
    path = pathlib.Path(setting)
    if path == kmsg:
        return follow_kmsg(path), "kmsg"
    log.info("xid_watch", file=str(path))
    return follow_file(path), "file"


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        print(f"ftsup agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse: usage error (2) or --help (0)
        return int(exc.code or 0)
    logs.configure(json=config.log_json, level=config.log_level)
    # Before any thread starts, on the thread that will spawn trainers: they inherit no capability.
    drop_ambient_capabilities()
    try:
        return asyncio.run(run_agent(config))
    except (tls.TlsConfigError, MetricsListenError) as exc:
        print(f"ftsup agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK
