"""Supervisor process configuration: flags and the job file, validated once, logged once.

The job file (JSON) says what to train and on how many nodes:
  {"name": "gpt-demo", "nodes": 3, "ranks_per_node": 2,
   "argv": ["python", "-m", "trainer.examples.gpt", "--steps", "100"],
   "env": {"OMP_NUM_THREADS": "1"}, "master_port_base": 29500}
"""

from __future__ import annotations

import argparse
import json
import pathlib
from dataclasses import dataclass

from supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from supervisor.server.authz import AuthzConfigError, load_token


class ConfigError(ValueError):
    """Bad configuration; the text names the value and the rule."""


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    listen: str
    data_dir: pathlib.Path
    core: CoreConfig
    tick_s: float
    snapshot_every: int
    segment_bytes: int
    operator_token: str | None
    log_json: bool | None
    log_level: str
    etcd_endpoints: tuple[str, ...] = ()  # empty: the embedded log
    etcd_prefix: str = ""
    advertise: str = ""
    lease_ttl_s: int = 2


def load_job(path: pathlib.Path) -> JobSpec:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read job file {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"job file {path} must hold a JSON object")
    known = {"name", "nodes", "ranks_per_node", "argv", "env", "master_port_base", "master_port_span"}
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
        )
    except KeyError as exc:
        raise ConfigError(f"job file {path}: missing key {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"job file {path}: {exc}") from exc


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup supervisor", description="Run the ftsup supervisor (embedded event log).")
    p.add_argument("--listen", default="127.0.0.1:7070", help="host:port for agents and supervisorctl")
    p.add_argument("--data-dir", default="/var/lib/ftsup/supervisor", type=pathlib.Path, help="event log directory")
    p.add_argument("--job", required=True, type=pathlib.Path, help="job file (JSON), see README")
    p.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    p.add_argument("--heartbeat-misses", type=int, default=2, help="dead after this many silent intervals")
    p.add_argument("--reconnect-grace-s", type=float, default=0.4, help="dead when a closed stream stays closed this long")
    p.add_argument("--spare-grace-s", type=float, default=10.0,
                   help="after start, wait this long for active nodes before a spare stands in for one")
    p.add_argument("--allowed-nodes", default="", help="comma-separated node ids; empty allows any")
    p.add_argument("--tick-s", type=float, default=0.1, help="how often detectors and the planner run")
    p.add_argument("--snapshot-every", type=int, default=10_000,
                   help="write a state snapshot (and compact the log) every this many events")
    p.add_argument("--segment-mib", type=int, default=64, help="event log segment size in MiB")
    p.add_argument("--etcd", default="", help="etcd endpoints host:port[,host:port...]: replicated mode"
                   " (run 3 replicas against one etcd cluster); empty: the embedded log in --data-dir")
    p.add_argument("--etcd-prefix", default="", help="key prefix of this job in etcd (default /ftsup/JOB)")
    p.add_argument("--advertise", default="", help="host:port agents and operators reach this replica at"
                   " (default: --listen)")
    p.add_argument("--lease-ttl-s", type=int, default=2, help="leader lease TTL (whole seconds)")
    p.add_argument("--operator-token-file", type=pathlib.Path, default=None,
                   help="bearer token (mode 600) required for commands that change anything; without it"
                        " they are allowed only when --listen is loopback")
    p.add_argument("--log-json", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def from_args(args: argparse.Namespace) -> SupervisorConfig:
    try:
        detector = DetectorConfig(
            heartbeat_interval_s=args.heartbeat_interval_s,
            heartbeat_misses=args.heartbeat_misses,
            reconnect_grace_s=args.reconnect_grace_s,
        )
        if not 0.01 <= args.tick_s <= 5:
            raise ValueError(f"--tick-s must be within [0.01, 5], got {args.tick_s}")
        if not 100 <= args.snapshot_every <= 10_000_000:
            raise ValueError(f"--snapshot-every must be within [100, 10000000], got {args.snapshot_every}")
        if not 1 <= args.segment_mib <= 4096:
            raise ValueError(f"--segment-mib must be within [1, 4096], got {args.segment_mib}")
        core = CoreConfig(
            job=load_job(args.job),
            detector=detector,
            allowed_nodes=frozenset(n for n in args.allowed_nodes.split(",") if n),
            spare_grace_s=args.spare_grace_s,
        )
        if not 0 <= args.spare_grace_s <= 3600:
            raise ValueError(f"--spare-grace-s must be within [0, 3600], got {args.spare_grace_s}")
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        token = load_token(args.operator_token_file) if args.operator_token_file else None
    except AuthzConfigError as exc:
        raise ConfigError(str(exc)) from exc
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
        segment_bytes=args.segment_mib * 1024 * 1024,
        operator_token=token,
        etcd_endpoints=tuple(e.strip() for e in args.etcd.split(",") if e.strip()),
        etcd_prefix=(args.etcd_prefix or f"/ftsup/{core.job.name}").rstrip("/"),
        advertise=args.advertise or args.listen,
        lease_ttl_s=args.lease_ttl_s,
        log_json=args.log_json,
        log_level=args.log_level,
    )
