"""Supervisor process configuration: flags and the job file, validated once, logged once.

The job file (JSON) says what to train and on how many nodes:
  {"name": "gpt-demo", "nodes": 3, "ranks_per_node": 2,
   "argv": ["python", "-m", "ftsup.trainer.examples.gpt", "--steps", "100"],
   "env": {"OMP_NUM_THREADS": "1"}, "master_port_base": 29500,
   "code_version": "git:1a2b3c4", "data_version": "c4-en@2024-05",
   "cwd": "/srv/train", "max_restarts": 3, "sigterm_grace_s": 30}
`cwd`, `max_restarts` (absent: unlimited) and `sigterm_grace_s` (default 3) are the keys
`ftsup run` also sets from torchrun-style flags, so both describe the same JobSpec.
The two versions are optional; with the spec's hash they form the experiment record every
GenerationStarted carries.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
from dataclasses import dataclass, field

from ftsup.common import tls
from ftsup.common.config_file import ConfigFileError, add_config_flag, parse_layered
from ftsup.common.metrics_http import MetricsListenError, check_metrics_listen
from ftsup.common.node_id import node_id_problem
from ftsup.supervisor.core.config import CheckpointTiming, CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.policies.interval import IntervalConfig
from ftsup.supervisor.core.policies.recompute import RecomputeConfig
from ftsup.supervisor.core.policies.sdc import Replicas, SdcConfig
from ftsup.supervisor.metrics import ThroughputConfig
from ftsup.supervisor.server.authz import AuthzConfigError, load_token
from ftsup.supervisor.web.server import StatusListenError, check_status_listen

ENV_PREFIX = "FTSUP_SUPERVISOR_"


class ConfigError(ValueError):
    """Bad configuration; the text names the value and the rule."""


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    listen: str
    data_dir: pathlib.Path
    core: CoreConfig
    tick_s: float
    snapshot_every: int
    gc_refreeze_s: float  # 0: the collector as CPython has it (common/gc_pacing.py)
    segment_bytes: int
    operator_token: str | None
    log_json: bool | None
    log_level: str
    etcd_endpoints: tuple[str, ...] = ()  # empty: the embedded log
    etcd_prefix: str = ""
    advertise: str = ""
    lease_ttl_s: int = 2
    # Replicated only: every replica holds a link shard (its share of the agents' streams, relayed
    # to the leader by followers; supervisor/shard.py). False: agents connect to the leader alone.
    link_shards: bool = True
    server_tls: tls.TlsFiles | None = None  # None: plaintext (loopback, or --insecure)
    operator_read_token: str | None = None  # operator_token is the admin one
    etcd_tls: tls.TlsFiles | None = None
    metrics_listen: str = ""  # empty: no Prometheus endpoint
    status_listen: str = ""  # empty: no status page (supervisor/web)
    throughput: ThroughputConfig = ThroughputConfig()
    checkpoints: CheckpointSettings = field(default_factory=lambda: CheckpointSettings())
    max_concurrent_rpcs: int = 0  # 0: derived from the job (server_limits.default_max_concurrent_rpcs)


@dataclass(frozen=True, slots=True)
class CheckpointSettings:
    """Object-store checkpoints: where, how often, how many kept. Never holds credentials."""

    location: str = ""  # s3://bucket/prefix or a directory; "" = off
    every_steps: int = 0
    keep: int = 3
    endpoint_url: str = ""
    region: str = ""
    is_auto: bool = False  # --checkpoint-every-steps auto: the Young/Daly interval decides


def every_steps_value(text: str) -> int | str:
    """--checkpoint-every-steps: a step count, or "auto" (the Young/Daly interval)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a step count or 'auto', got {text!r}") from None


every_steps_value.takes_int = True  # type: ignore[attr-defined]  # a TOML integer is a count


def checkpoint_settings(args: argparse.Namespace) -> CheckpointSettings:
    raw = args.checkpoint_every_steps
    is_auto = raw == "auto"
    settings = CheckpointSettings(args.checkpoint_location, 0 if is_auto else int(raw), args.checkpoint_keep,
                                  args.checkpoint_endpoint, args.checkpoint_region, is_auto)
    if not 0 <= settings.every_steps <= 10_000_000:
        raise ValueError(f"--checkpoint-every-steps must be within [0, 10000000] or 'auto', got {settings.every_steps}")
    if not 1 <= settings.keep <= 10_000:
        raise ValueError(f"--checkpoint-keep must be within [1, 10000], got {settings.keep}")
    if (settings.every_steps or is_auto) and not settings.location:
        raise ValueError(f"--checkpoint-every-steps {raw} needs --checkpoint-location")
    if settings.location:
        from ftsup.checkpoint.location import parse_location

        parse_location(settings.location)  # ValueError naming the value
    return settings


def with_checkpoint_env(job: JobSpec, settings: CheckpointSettings) -> JobSpec:
    """Trainers learn the location and cadence from their environment (FTSUP_CHECKPOINT_*)."""
    if not settings.location:
        return job
    extra = {
        "FTSUP_CHECKPOINT_LOCATION": settings.location,
        "FTSUP_CHECKPOINT_EVERY_STEPS": str(settings.every_steps),
        "FTSUP_CHECKPOINT_ENDPOINT": settings.endpoint_url,
        "FTSUP_CHECKPOINT_REGION": settings.region,
    }
    env = tuple((k, v) for k, v in job.env if k not in extra) + tuple(extra.items())
    return dataclasses.replace(job, env=env)


def load_job(path: pathlib.Path) -> JobSpec:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read job file {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"job file {path} must hold a JSON object")
    known = {"name", "nodes", "ranks_per_node", "argv", "env", "master_port_base", "master_port_span",
             "code_version", "data_version", "min_nodes", "sdc_replicas", "model_parallel_size", "cwd",
             "max_restarts", "sigterm_grace_s"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"job file {path}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    argv = raw.get("argv")
    env = raw.get("env", {})
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ConfigError(f"job file {path}: argv must be a list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError(f"job file {path}: env must map strings to strings")
    try:
        return JobSpec(
            name=str(raw.get("name", "job")),
            nodes=int(raw["nodes"]),
            ranks_per_node=int(raw.get("ranks_per_node", 1)),
            argv=tuple(argv),
            env=tuple(sorted(env.items())),
            master_port_base=int(raw.get("master_port_base", 29500)),
            master_port_span=int(raw.get("master_port_span", 500)),
            code_version=_version(raw, "code_version"),
            data_version=_version(raw, "data_version"),
            min_nodes=int(raw.get("min_nodes", 0)),
            max_restarts=_optional_int(raw, "max_restarts"),
            sigterm_grace_s=float(raw.get("sigterm_grace_s", 3.0)),
            cwd=_string(raw, "cwd"),
        )
    except KeyError as exc:
        raise ConfigError(f"job file {path}: missing key {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"job file {path}: {exc}") from exc


def load_job_sdc(path: pathlib.Path) -> SdcConfig:
    """The job file's statement of which ranks are replicas, for the SDC vote: `sdc_replicas`
    ("reported": each rank's replica group from its device mesh, the default; "layout": rank %
    `model_parallel_size`; "none": nobody is a replica, no vote) and `model_parallel_size`."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read job file {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"job file {path} must hold a JSON object")
    replicas = raw.get("sdc_replicas", Replicas.REPORTED.value)
    known = [r.value for r in Replicas]
    if replicas not in known:
        raise ConfigError(f"job file {path}: sdc_replicas must be one of {known}, got {replicas!r}")
    size = raw.get("model_parallel_size", 1)
    if isinstance(size, bool) or not isinstance(size, int):
        raise ConfigError(f"job file {path}: model_parallel_size must be an integer, got {size!r}")
    try:
        return SdcConfig(model_parallel_size=size, replicas=Replicas(replicas))
    except ValueError as exc:
        raise ConfigError(f"job file {path}: {exc}") from exc


def _optional_int(raw: dict[str, object], key: str) -> int | None:
    """An integer key whose absence (or null) means "no limit"."""
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer or null, got {value!r}")
    return value


def _string(raw: dict[str, object], key: str) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


def _version(raw: dict[str, object], key: str) -> str:
    """The experiment record's optional strings (a git commit, a data set snapshot id)."""
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup supervisor", description="Run the ftsup supervisor (embedded event log).")
    add_config_flag(p, "supervisor", ENV_PREFIX)
    p.add_argument("--listen", default="127.0.0.1:7070", help="host:port for agents and supervisorctl")
    p.add_argument("--data-dir", default="/var/lib/ftsup/supervisor", type=pathlib.Path, help="event log directory")
    p.add_argument("--job", required=True, type=pathlib.Path, help="job file (JSON), see README")
    p.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    p.add_argument("--heartbeat-misses", type=int, default=2, help="dead after this many silent intervals")
    p.add_argument("--reconnect-grace-s", type=float, default=0.4, help="dead when a closed stream stays closed this long")
    p.add_argument("--agent-probe", action=argparse.BooleanOptionalAction, default=True,
                   help="after a node's stream closes, connect once to its agent's peer port; refused, the"
                        " node is dead 0.15 s after the close instead of after --reconnect-grace-s (trusted"
                        " only for ports seen accepting while the stream was open)")
    p.add_argument("--failover-grace-s", type=float, default=3.0,
                   help="a new leader waits this much longer than one heartbeat timeout before judging nodes")
    p.add_argument("--exit-settle-s", type=float, default=3.0,
                   help="how long a rank exit that looks like collateral damage (a peer's connection broke"
                        " under it) waits for the real cause before it ends the generation itself")
    p.add_argument("--spare-grace-s", type=float, default=10.0,
                   help="after start, wait this long for active nodes before a spare stands in for one")
    p.add_argument("--allowed-nodes", default="", help="comma-separated node ids; empty allows any")
    p.add_argument("--tick-s", type=float, default=0.1, help="how often detectors and the planner run")
    p.add_argument("--snapshot-every", type=int, default=10_000,
                   help="write a state snapshot (and compact the log) every this many events")
    p.add_argument("--segment-mib", type=int, default=64, help="event log segment size in MiB")
    p.add_argument("--gc-refreeze-s", type=float, default=0.0,
                   help="experimental: freeze what survives each full garbage collection out of the next (a link"
                        " shard's large heap is then not walked at every training step) and thaw and collect it"
                        " every this many seconds (600 is the value measured); 0 (default): CPython's collector"
                        " unchanged, its pauses reported in ftsup_gc_pause_seconds")
    p.add_argument("--etcd", default="", help="etcd endpoints host:port[,host:port...]: replicated mode"
                   " (run 3 replicas against one etcd cluster); empty: the embedded log in --data-dir")
    p.add_argument("--etcd-prefix", default="", help="key prefix of this job in etcd (default /ftsup/JOB)")
    p.add_argument("--advertise", default="", help="host:port agents and operators reach this replica at"
                   " (default: --listen)")
    p.add_argument("--lease-ttl-s", type=int, default=2, help="leader lease TTL (whole seconds)")
    p.add_argument("--no-link-shards", dest="link_shards", action="store_false",
                   help="replicated: agents connect to the leader alone instead of being spread over every"
                        " replica's link shard (docs/scale.md)")
    p.add_argument("--operator-token-file", type=pathlib.Path, default=None,
                   help="admin bearer token (mode 600): every operator command, including those that change"
                        " anything; without any token or TLS, commands that change anything are allowed only"
                        " when --listen is loopback")
    p.add_argument("--operator-read-token-file", type=pathlib.Path, default=None,
                   help="read-only bearer token (mode 600): status, nodes, events, leader; never commands")
    p.add_argument("--tls-cert", type=pathlib.Path, default=None, help="this replica's certificate (PEM); enables mTLS")
    p.add_argument("--tls-key", type=pathlib.Path, default=None, help="its private key (PEM, mode 600)")
    p.add_argument("--tls-ca", type=pathlib.Path, default=None,
                   help="CA (PEM) that signs agents' and operators' client certificates")
    p.add_argument("--insecure", action="store_true", default=False,
                   help="allow a plaintext --listen, --etcd or --metrics-listen beyond loopback (no TLS):"
                        " only on a trusted network")
    p.add_argument("--etcd-cert", type=pathlib.Path, default=None, help="client certificate for etcd (PEM)")
    p.add_argument("--etcd-key", type=pathlib.Path, default=None, help="its private key (PEM)")
    p.add_argument("--etcd-ca", type=pathlib.Path, default=None, help="CA (PEM) that signs etcd's server certificates")
    p.add_argument("--metrics-listen", default="", help="host:port for Prometheus to scrape /metrics"
                   " (e.g. 0.0.0.0:9464); HTTPS with client certificates when --tls-* is set, else plain HTTP"
                   " on loopback only (or --insecure); empty: no metrics endpoint")
    p.add_argument("--status-listen", default="", help="host:port for the read-only status page at /status"
                   " (e.g. 127.0.0.1:9465); HTTPS needing an operator client certificate when --tls-* is set,"
                   " else plain HTTP on loopback only (or --insecure); empty: no status page")
    p.add_argument("--flops-per-token", type=float, default=0.0,
                   help="the model's training FLOPs per token (about 6 x parameters), for the MFU metric")
    p.add_argument("--peak-flops-per-rank", type=float, default=0.0,
                   help="one rank's peak FLOP/s (e.g. 989e12 for an H100, dense BF16), for the MFU metric")
    p.add_argument("--metrics-per-rank-limit", type=int, default=1024,
                   help="export per-rank step/compute gauges only up to this many ranks")
    p.add_argument("--metrics-per-node-limit", type=int, default=1024,
                   help="per-node gauges (Xids, straggler score, heartbeat age) for every node up to this many"
                   " nodes; past it, each gauge's worst this many")
    p.add_argument("--checkpoint-location", default="",
                   help="object-store checkpoints: s3://bucket/prefix or a directory; empty: off")
    p.add_argument("--checkpoint-every-steps", type=every_steps_value, default=0, metavar="N|auto",
                   help="checkpoint every N optimizer steps (0: only on request); 'auto': at the Young/Daly"
                   " interval from the measured checkpoint cost and the observed MTBF; needs --checkpoint-location")
    p.add_argument("--checkpoint-timeout-s", type=float, default=1800.0,
                   help="abort a checkpoint attempt not committed this long after it started (a shard never written)")
    p.add_argument("--checkpoint-lead-steps", type=int, default=3,
                   help="a requested checkpoint (checkpoint now, auto) is at least this many steps ahead")
    p.add_argument("--checkpoint-lead-s", type=float, default=2.0,
                   help="... and at least this many seconds of steps ahead, so every rank hears of it in time")
    p.add_argument("--checkpoint-prior-mtbf-h", type=float, default=24.0,
                   help="Young/Daly: the job's MTBF assumed until 3 failures are seen")
    p.add_argument("--checkpoint-prior-cost-s", type=float, default=60.0,
                   help="Young/Daly: the checkpoint cost assumed until one has committed")
    p.add_argument("--checkpoint-min-interval-s", type=float, default=60.0,
                   help="Young/Daly: never checkpoint more often than this")
    p.add_argument("--checkpoint-keep", type=int, default=3, help="committed checkpoints kept (older are deleted)")
    p.add_argument("--checkpoint-endpoint", default="",
                   help="S3 endpoint URL (MinIO, SeaweedFS, ...); empty: AWS. Credentials: the AWS_* environment")
    p.add_argument("--checkpoint-region", default="", help="S3 region; empty: boto3's default")
    p.add_argument("--sdc-recompute-every-steps", type=int, default=0,
                   help="SDC recompute check: replay one step every N steps on another node (0: only on split votes)")
    p.add_argument("--sdc-recompute-timeout-s", type=float, default=300.0,
                   help="a recompute check without an answer this long is inconclusive (commits resume)")
    p.add_argument("--sdc-recompute-on-split", action=argparse.BooleanOptionalAction, default=True,
                   help="recompute a step whose digest vote split without a majority")
    p.add_argument("--sdc-full-replay-max-world", type=int, default=16,
                   help="replay every rank of a checked step (and its update) up to this world size")
    p.add_argument("--max-concurrent-rpcs", type=int, default=0,
                   help="RPCs served at once (each agent holds one stream); beyond it calls are refused with"
                        " RESOURCE_EXHAUSTED. 0: 2 x the job's nodes + 1024")
    p.add_argument("--log-json", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def from_args(args: argparse.Namespace) -> SupervisorConfig:
    try:
        detector = DetectorConfig(
            heartbeat_interval_s=args.heartbeat_interval_s,
            heartbeat_misses=args.heartbeat_misses,
            reconnect_grace_s=args.reconnect_grace_s,
            failover_grace_s=args.failover_grace_s,
            agent_probe=args.agent_probe,
        )
        if not 0.01 <= args.tick_s <= 5:
            raise ValueError(f"--tick-s must be within [0.01, 5], got {args.tick_s}")
        if args.gc_refreeze_s != 0 and not 10 <= args.gc_refreeze_s <= 86_400:
            raise ValueError(f"--gc-refreeze-s must be 0 (off) or within [10, 86400], got {args.gc_refreeze_s}")
        if not 100 <= args.snapshot_every <= 10_000_000:
            raise ValueError(f"--snapshot-every must be within [100, 10000000], got {args.snapshot_every}")
        if not 1 <= args.segment_mib <= 4096:
            raise ValueError(f"--segment-mib must be within [1, 4096], got {args.segment_mib}")
        checkpoints = checkpoint_settings(args)
        core = CoreConfig(
            job=with_checkpoint_env(load_job(args.job), checkpoints),
            sdc=load_job_sdc(args.job),
            checkpoint_location=checkpoints.location,
            checkpoint_every_steps=checkpoints.every_steps,
            checkpoint_timing=CheckpointTiming(
                is_auto=checkpoints.is_auto,
                interval=IntervalConfig(prior_mtbf_s=args.checkpoint_prior_mtbf_h * 3600.0,
                                        checkpoint_cost_s=args.checkpoint_prior_cost_s,
                                        min_interval_s=args.checkpoint_min_interval_s,
                                        max_interval_s=max(24 * 3600.0, args.checkpoint_min_interval_s)),
                lead_steps=args.checkpoint_lead_steps,
                lead_s=args.checkpoint_lead_s,
                timeout_s=args.checkpoint_timeout_s,
            ),
            detector=detector,
            allowed_nodes=frozenset(n for n in args.allowed_nodes.split(",") if n),
            spare_grace_s=args.spare_grace_s,
            exit_settle_s=args.exit_settle_s,
            recompute=RecomputeConfig(every_steps=args.sdc_recompute_every_steps,
                                      timeout_s=args.sdc_recompute_timeout_s,
                                      full_replay_max_world=args.sdc_full_replay_max_world,
                                      is_on_split=args.sdc_recompute_on_split),
        )
        if not 0 <= args.exit_settle_s <= 600:
            raise ValueError(f"--exit-settle-s must be within [0, 600], got {args.exit_settle_s}")
        if not 0 <= args.spare_grace_s <= 3600:
            raise ValueError(f"--spare-grace-s must be within [0, 3600], got {args.spare_grace_s}")
        throughput = ThroughputConfig(args.flops_per_token, args.peak_flops_per_rank, args.metrics_per_rank_limit,
                                      args.metrics_per_node_limit)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        token = load_token(args.operator_token_file) if args.operator_token_file else None
        read_token = load_token(args.operator_read_token_file) if args.operator_read_token_file else None
    except AuthzConfigError as exc:
        raise ConfigError(str(exc)) from exc
    if token is not None and token == read_token:
        raise ConfigError("--operator-token-file and --operator-read-token-file hold the same token")
    try:
        server_tls = tls.tls_files(args.tls_cert, args.tls_key, args.tls_ca)
        etcd_tls = tls.tls_files(args.etcd_cert, args.etcd_key, args.etcd_ca, flag_prefix="--etcd")
        tls.check_listen(args.listen, server_tls, is_insecure_allowed=args.insecure, flag="--listen")
        etcd_endpoints = tuple(e.strip() for e in args.etcd.split(",") if e.strip())
        for endpoint in etcd_endpoints:
            tls.check_listen(endpoint, etcd_tls, is_insecure_allowed=args.insecure, flag="--etcd")
        if args.metrics_listen:
            check_metrics_listen(args.metrics_listen, server_tls, is_insecure_allowed=args.insecure)
        if args.status_listen:
            check_status_listen(args.status_listen, server_tls, is_insecure_allowed=args.insecure)
    except (tls.TlsConfigError, MetricsListenError, StatusListenError) as exc:
        raise ConfigError(str(exc)) from exc
    for node in (n for n in args.allowed_nodes.split(",") if n):
        if (problem := node_id_problem(node)) is not None:
            raise ConfigError(f"--allowed-nodes: {problem}")
    if not 0 <= args.max_concurrent_rpcs <= 1_000_000:
        raise ConfigError(f"--max-concurrent-rpcs must be within [0, 1000000] (0: derived), got {args.max_concurrent_rpcs}")
    if not 1 <= args.lease_ttl_s <= 60:
        raise ConfigError(f"--lease-ttl-s must be within [1, 60], got {args.lease_ttl_s}")
    if ":" not in args.listen:
        raise ConfigError(f"--listen must be host:port, got {args.listen!r}")
    return SupervisorConfig(
        listen=args.listen,
        data_dir=args.data_dir,
        core=core,
        tick_s=args.tick_s,
        snapshot_every=args.snapshot_every,
        gc_refreeze_s=args.gc_refreeze_s,
        segment_bytes=args.segment_mib * 1024 * 1024,
        operator_token=token,
        operator_read_token=read_token,
        server_tls=server_tls,
        etcd_tls=etcd_tls,
        etcd_endpoints=etcd_endpoints,
        etcd_prefix=(args.etcd_prefix or f"/ftsup/{core.job.name}").rstrip("/"),
        advertise=args.advertise or args.listen,
        lease_ttl_s=args.lease_ttl_s,
        link_shards=args.link_shards,
        log_json=args.log_json,
        log_level=args.log_level,
        metrics_listen=args.metrics_listen,
        status_listen=args.status_listen,
        throughput=throughput,
        checkpoints=checkpoints,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
    )


def load(argv: list[str] | None) -> SupervisorConfig:
    """Flags over environment (FTSUP_SUPERVISOR_<KEY>) over --config FILE over defaults, validated.

    argparse exits 2 on unknown flags; every other problem is a ConfigError naming the value.
    """
    try:
        args = parse_layered(parser(), argv, env_prefix=ENV_PREFIX)
    except ConfigFileError as exc:
        raise ConfigError(str(exc)) from exc
    return from_args(args)
