"""The agent's one frozen configuration: parsed from the command line once, validated, logged.

Every limit is checked here and a bad value is rejected naming the value and the limit, so the
rest of the agent can trust its inputs (STYLE 10, 11: no env vars overriding arguments).
"""

from __future__ import annotations

import argparse
import glob
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ftsup.agent.core.hang import HangConfig
from ftsup.common import tls
from ftsup.common.config_file import ConfigFileError, add_config_flag, parse_layered
from ftsup.common.hello_fields import MAX_FAILURE_DOMAIN_CHARS, host_problem, text_problem
from ftsup.common.metrics_http import MetricsListenError, check_metrics_listen
from ftsup.common.node_id import node_id_problem
from ftsup.v1 import events_pb2

MAX_HEARTBEAT_INTERVAL_S = 60.0
MAX_SNAPSHOT_MEMORY_MIB = 64 * 1024 * 1024  # 64 TiB
ENV_PREFIX = "FTSUP_AGENT_"
# Variables under the prefix that are not options: the agent sets these for its trainers.
NOT_OPTIONS = frozenset({"FTSUP_AGENT_ADDRESS"})


class ConfigError(ValueError):
    """A command-line value is invalid; the message names the flag, the value and the limit."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node_id: str
    supervisors: tuple[str, ...]  # host:port, tried in order
    role: str  # "active" | "spare"
    host: str
    peer_port: int  # 0: pick a free one
    workdir: Path
    heartbeat_interval_s: float
    gpus: int
    log_json: bool | None
    log_level: str
    trainer_nice: int = 0
    warm_trainers: int = 0
    xid_log: str = "none"  # file path, /dev/kmsg, auto or none
    failure_domain: str = ""
    hang: HangConfig = HangConfig()
    tls_files: tls.TlsFiles | None = None  # mTLS to supervisors and peers; None: plaintext
    metrics_listen: str = ""  # host:port of /metrics; empty: none
    snapshot_memory_mib: int = 0  # cap on snapshots held + arriving; 0: none (the derived limit, <= half the RAM)
    # How long a new generation waits for this node's broken trainers to ask to rejoin in-process
    # (the first of them; the rest get twice as long) before restarting them as processes.
    rejoin_wait_s: float = 0.5

    @property
    def snapshot_memory_bytes(self) -> int:
        return self.snapshot_memory_mib * 1024 * 1024

    @property
    def socket_path(self) -> Path:
        return self.workdir / "agent.sock"

    @property
    def trainer_link_address(self) -> str:
        return f"unix:{self.socket_path}"

    @property
    def role_proto(self) -> events_pb2.NodeRole.ValueType:
        return events_pb2.NODE_ROLE_SPARE if self.role == "spare" else events_pb2.NODE_ROLE_ACTIVE

    def effective(self) -> dict[str, object]:
        """The values as they will be used, for one log line at start-up."""
        values = asdict(self)
        values["workdir"] = str(self.workdir)
        values["supervisors"] = list(self.supervisors)
        values["tls_files"] = {k: str(v) for k, v in values["tls_files"].items()} if self.tls_files else None
        return values


def count_gpus() -> int:
    return len(glob.glob("/dev/nvidia[0-9]*"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup agent", description="ftsup node agent")
    add_config_flag(p, "agent", ENV_PREFIX)
    p.add_argument("--node-id", required=True, help="this node's id, [A-Za-z0-9._-]{1,64}")
    p.add_argument("--supervisor", required=True, help="HOST:PORT[,HOST:PORT...] of the supervisors")
    p.add_argument("--role", choices=("active", "spare"), default="active")
    p.add_argument("--host", default="127.0.0.1", help="address peers and trainers use to reach this node")
    p.add_argument("--peer-port", type=int, default=0, help="AgentPeer listen port (0: pick a free one)")
    p.add_argument("--workdir", default=None, help="default /var/lib/ftsup/agent/NODE")
    p.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    p.add_argument("--gpus", type=int, default=None, help="default: count of /dev/nvidia[0-9]*")
    p.add_argument("--trainer-nice", type=int, default=0,
                   help="niceness for trainer processes (0..19): keeps the agent responsive when trainers"
                        " saturate the CPUs (CPU-only training, busy data loaders)")
    p.add_argument("--warm-trainers", type=int, default=0,
                   help="idle pre-warmed Python processes (torch imported) kept ready to become trainer"
                        " ranks: restarts skip seconds of start-up; set to the ranks per node (0: off)")
    p.add_argument("--failure-domain", default="",
                   help="rack or power domain of this node: spares from another domain replace lost nodes first")
    p.add_argument("--xid-log", default="auto",
                   help="where to watch for NVIDIA Xid lines: a kernel-log file followed like tail -F,"
                        " /dev/kmsg, 'auto' (/dev/kmsg when readable) or 'none'")
    p.add_argument("--snapshot-memory-mib", type=int, default=0,
                   help="cap on RAM for snapshots held (own ranks' and buddies') plus those arriving. The limit is"
                        " derived from the job's snapshot sizes (ranks x largest snapshot x (retained steps + 2) +"
                        " 25%%), capped by half the machine's RAM and by this when given (0: no explicit cap); a"
                        " snapshot that does not fit is refused (RESOURCE_EXHAUSTED) before its bytes arrive; a"
                        " rank's snapshot may also declare at most 4x the largest of that rank held")
    p.add_argument("--rejoin-wait-s", type=float, default=0.5,
                   help="in-process rejoin: how long a new generation waits for the first of this node's broken"
                        " trainers to ask to rejoin (the rest get twice this) before restarting them as processes;"
                        " a CPU-starved host may need more, at the cost of that much more wait when ranks are"
                        " blocked in a collective and cannot ask")
    p.add_argument("--hang-multiple", type=float, default=10.0,
                   help="a rank is hung after this many median step times without progress")
    p.add_argument("--hang-floor-s", type=float, default=120.0, help="...but never sooner than this")
    p.add_argument("--hang-startup-s", type=float, default=600.0, help="allowance before a generation's first step")
    p.add_argument("--tls-cert", default=None,
                   help="this node's certificate (PEM, SAN spiffe://ftsup/node/NODE_ID): mTLS to the"
                        " supervisors and between peers")
    p.add_argument("--tls-key", default=None, help="its private key (PEM, mode 600)")
    p.add_argument("--tls-ca", default=None, help="CA (PEM) that signs supervisors' and peers' certificates")
    p.add_argument("--insecure", action="store_true", default=False,
                   help="allow the peer service (--host) and --metrics-listen in plaintext beyond loopback (no TLS)")
    p.add_argument("--metrics-listen", default="", help="host:port for Prometheus to scrape /metrics"
                   " (e.g. 0.0.0.0:9465); HTTPS with client certificates when --tls-* is set, else plain HTTP"
                   " on loopback only (or --insecure); empty: no metrics endpoint")
    p.add_argument("--log-json", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def parse_address(text: str) -> str:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--supervisor: {text!r} is not HOST:PORT with a port in 1..65535")
    return f"{host}:{int(port)}"


def config_from_args(ns: argparse.Namespace) -> AgentConfig:
    if (problem := node_id_problem(ns.node_id)) is not None:
        raise ConfigError(f"--node-id: {problem}")
    if (problem := host_problem(ns.host.strip())) is not None:
        raise ConfigError(f"--host: {problem}")
    if (problem := text_problem("failure domain", ns.failure_domain.strip(), MAX_FAILURE_DOMAIN_CHARS)) is not None:
        raise ConfigError(f"--failure-domain: {problem}")
    supervisors = tuple(parse_address(part) for part in ns.supervisor.split(",") if part.strip())
    if not supervisors:
        raise ConfigError(f"--supervisor: {ns.supervisor!r} names no HOST:PORT")
    interval = ns.heartbeat_interval_s
    if not (math.isfinite(interval) and 0 < interval <= MAX_HEARTBEAT_INTERVAL_S):
        raise ConfigError(
            f"--heartbeat-interval-s: {interval!r} must be finite, > 0 and <= {MAX_HEARTBEAT_INTERVAL_S}"
        )
    if not 0 <= ns.peer_port < 65536:
        raise ConfigError(f"--peer-port: {ns.peer_port} must be within 0..65535")
    gpus = count_gpus() if ns.gpus is None else ns.gpus
    if not 0 <= gpus <= 1024:
        raise ConfigError(f"--gpus: {gpus} must be within 0..1024")
    if not ns.host.strip():
        raise ConfigError("--host must not be empty")
    try:
        hang = HangConfig(ns.hang_multiple, ns.hang_floor_s, ns.hang_startup_s)
    except ValueError as exc:
        raise ConfigError(f"--hang-*: {exc}") from exc
    if not 0 <= ns.warm_trainers <= 64:
        raise ConfigError(f"--warm-trainers: {ns.warm_trainers} must be within 0..64")
    if not 0 <= ns.snapshot_memory_mib <= MAX_SNAPSHOT_MEMORY_MIB:
        raise ConfigError(f"--snapshot-memory-mib: {ns.snapshot_memory_mib} must be within 0..{MAX_SNAPSHOT_MEMORY_MIB}")
    if not 0.05 <= ns.rejoin_wait_s <= 60:
        raise ConfigError(f"--rejoin-wait-s: {ns.rejoin_wait_s} must be within 0.05..60")
    if not 0 <= ns.trainer_nice <= 19:
        raise ConfigError(f"--trainer-nice: {ns.trainer_nice} must be within 0..19")
    try:
        files = tls.tls_files(ns.tls_cert, ns.tls_key, ns.tls_ca)
        # Only listening is checked: a plaintext supervisor beyond loopback already had to say --insecure.
        tls.check_listen(f"{ns.host.strip()}:0", files, is_insecure_allowed=ns.insecure, flag="--host")
    except tls.TlsConfigError as exc:
        raise ConfigError(str(exc)) from exc
    if ns.metrics_listen:
        try:
            check_metrics_listen(ns.metrics_listen, files, is_insecure_allowed=ns.insecure)
        except MetricsListenError as exc:
            raise ConfigError(str(exc)) from exc
    workdir = Path(ns.workdir) if ns.workdir else Path("/var/lib/ftsup/agent") / ns.node_id
    # AF_UNIX paths are limited to 107 bytes on Linux; fail here, not at bind time.
    if len(str(workdir.absolute() / "agent.sock").encode()) > 107:
        raise ConfigError(f"--workdir: {str(workdir)!r} is too long for a unix socket path (limit 107 bytes)")
    return AgentConfig(
        node_id=ns.node_id,
        supervisors=supervisors,
        role=ns.role,
        host=ns.host.strip(),
        peer_port=ns.peer_port,
        workdir=workdir.absolute(),
        heartbeat_interval_s=float(interval),
        gpus=gpus,
        log_json=ns.log_json,
        log_level=ns.log_level,
        trainer_nice=ns.trainer_nice,
        warm_trainers=ns.warm_trainers,
        xid_log=ns.xid_log,
        failure_domain=ns.failure_domain.strip(),
        hang=hang,
        tls_files=files,
        metrics_listen=ns.metrics_listen,
        snapshot_memory_mib=ns.snapshot_memory_mib,
        rejoin_wait_s=ns.rejoin_wait_s,
    )


def parse_config(argv: list[str] | None, environ: dict[str, str] | None = None) -> AgentConfig:
    """Flags over environment (FTSUP_AGENT_<KEY>) over --config FILE over defaults, validated.

    argparse exits 2 on unknown flags; every other problem is a ConfigError naming the value.
    """
    try:
        ns = parse_layered(build_parser(), argv, env_prefix=ENV_PREFIX, environ=environ, ignore_env=NOT_OPTIONS)
    except ConfigFileError as exc:
        raise ConfigError(str(exc)) from exc
    return config_from_args(ns)
