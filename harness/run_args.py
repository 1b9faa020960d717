"""`ftsup run`'s command line: torchrun's launch flags, accepted or refused by name.

Owns the translation from a torchrun command line to the job file the supervisor loads
(`job_dict`), so `ftsup run` and a production job file describe the same JobSpec. Accepted:
the flags whose meaning carries over to ftsup on one machine; refused, each with a one-line
reason: the rendezvous and agent internals that ftsup's supervisor replaces. No I/O here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ftsup.common import tls

DEFAULT_MAX_RESTARTS = 3  # `ftsup run`'s budget (a job file without max_restarts: unlimited)
DEFAULT_SIGTERM_GRACE_S = 3.0
MULTI_MACHINE = "for several machines run agents + a supervisor, see docs/run.md"

# torchrun flags ftsup refuses, by name, with the reason (torch.distributed.run's list).
REFUSED: dict[str, str] = {
    "rdzv-backend": f"ftsup's supervisor is the rendezvous; {MULTI_MACHINE}",
    "rdzv-endpoint": f"ftsup's supervisor is the rendezvous; {MULTI_MACHINE}",
    "rdzv-id": "the run id is the job name: use --job-name",
    "rdzv-conf": f"ftsup's supervisor is the rendezvous (its timeouts are supervisor flags); {MULTI_MACHINE}",
    "monitor-interval": "ftsup's agent watches ranks itself (exits at once, hangs by --hang-* agent flags)",
    "start-method": "ranks are always separate processes started by the agent (spawn-like)",
    "role": "ftsup runs one role per job (ROLE_NAME=default)",
    "run-path": "give the script or -m MODULE; ftsup runs it with this Python",
    "local-addr": "ftsup's agents find each other through the supervisor",
    "logs-specs": "per-rank files are written by ftsup's agents; --log-dir keeps a copy",
    "redirects": "ftsup always writes each rank's output to its file and shows it live, prefixed",
    "local-ranks-filter": "ftsup shows every rank; filter with grep '^\\[rank 0\\]:'",
    "numa-binding": "not supported yet: bind inside the script (e.g. numactl in a wrapper)",
    "event-log-handler": "ftsup keeps its own event log (supervisorctl events)",
    "signals-to-handle": "ftsup's agent stops ranks with SIGTERM then SIGKILL after --sigterm-grace-s",
    "virtual-local-rank": "not supported",
}


class RunUsageError(ValueError):
    """A command line ftsup run cannot honour; the text says which flag and why."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    nnodes: int
    nproc_per_node: int
    max_restarts: int
    argv: tuple[str, ...]  # the trainer command
    local_nodes: bool
    spares: int
    run_dir: str
    log_dir: str
    job_name: str
    sigterm_grace_s: float
    master_port: int | None
    tee: str
    is_json: bool
    is_dry_run: bool


class _Refuse(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        name = (option_string or self.dest).lstrip("-").replace("_", "-")
        raise argparse.ArgumentError(self, f"refused: {REFUSED[name]}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # a RunUsageError instead of exit(2), for tests
        raise RunUsageError(message)


def _spellings(name: str) -> list[str]:
    """torchrun accepts both --nproc-per-node and --nproc_per_node."""
    dashed = f"--{name}"
    under = f"--{name.replace('-', '_')}"
    return [dashed] if dashed == under else [dashed, under]


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ftsup run", allow_abbrev=False,
                description="Run a torchrun-style training script under ftsup on this machine: an embedded"
                            " supervisor and agent(s), torchrun's environment, gang restarts on failure.",
                epilog="Exit codes: 0 the job finished (every rank exited 0 or called Session.finish()),"
                       " 1 the job failed (restart budget spent), 2 bad usage, 3 ftsup itself could not run"
                       " the job, 130 interrupted. See docs/run.md.")
    p.add_argument(*_spellings("nnodes"), default="1", help="nodes (default 1); more than 1 needs --local-nodes")
    p.add_argument(*_spellings("nproc-per-node"), default="1", help="ranks per node (default 1)")
    p.add_argument(*_spellings("max-restarts"), type=int, default=DEFAULT_MAX_RESTARTS,
                   help=f"gang restarts after failures before the job fails (default {DEFAULT_MAX_RESTARTS})")
    p.add_argument("--standalone", action="store_true", help="accepted: ftsup run is always standalone")
    p.add_argument(*_spellings("node-rank"), type=int, default=0, help="accepted only as 0 (one machine)")
    p.add_argument(*_spellings("master-addr"), default="127.0.0.1", help="accepted only as a loopback address")
    p.add_argument(*_spellings("master-port"), type=int, default=None,
                   help="MASTER_PORT for every generation (default: a port per generation from a free range)")
    p.add_argument(*_spellings("log-dir"), default="", help="keep a copy of every rank's output here, per rank")
    p.add_argument("-t", "--tee", default="3", choices=["0", "1", "2", "3"],
                   help="accepted; ftsup always shows every rank's stdout and stderr, prefixed [rank N]:")
    p.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module (python -m)")
    p.add_argument(*_spellings("no-python"), action="store_true", help="run SCRIPT as an executable")
    for name in REFUSED:
        p.add_argument(*_spellings(name), action=_Refuse, nargs="?", help=argparse.SUPPRESS)
    ftsup = p.add_argument_group("ftsup")
    ftsup.add_argument("--local-nodes", action="store_true",
                       help="run --nnodes simulated nodes on this machine (one agent each): rehearse a node loss")
    ftsup.add_argument("--spares", type=int, default=0, help="hot spare nodes (with --local-nodes)")
    ftsup.add_argument("--run-dir", default="", help="event log, job file and rank logs (default: a fresh temp dir)")
    ftsup.add_argument("--job-name", default="run", help="the job's name (TORCHELASTIC_RUN_ID)")
    ftsup.add_argument("--sigterm-grace-s", type=float, default=DEFAULT_SIGTERM_GRACE_S,
                       help="SIGTERM, then SIGKILL after this many seconds (room for a save-on-SIGTERM handler)")
    ftsup.add_argument("--json", action="store_true", help="end with one JSON line: the outcome")
    ftsup.add_argument("--dry-run", action="store_true", help="print the job file this run would use, and exit")
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def _count(flag: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        if flag == "--nnodes" and ":" in text:
            raise RunUsageError(f"--nnodes {text}: elastic MIN:MAX is the job file's min_nodes; {MULTI_MACHINE}") from None
        raise RunUsageError(f"{flag} must be a whole number, got {text!r}") from None
    if not low <= value <= high:
        raise RunUsageError(f"{flag} must be within [{low}, {high}], got {value}")
    return value


def parse(argv: Sequence[str], python: str = sys.executable) -> RunSpec:
    """The run a command line asks for; RunUsageError names the flag and the reason."""
    try:
        args = parser().parse_args(list(argv))
    except argparse.ArgumentError as exc:
        raise RunUsageError(str(exc)) from None
    nnodes = _count("--nnodes", args.nnodes, 1, 64)
    nproc = _count("--nproc-per-node", args.nproc_per_node, 1, 64)
    if nnodes > 1 and not args.local_nodes:
        raise RunUsageError(f"--nnodes {nnodes} without --local-nodes: {MULTI_MACHINE}"
                            " (or add --local-nodes to simulate them on this machine)")
    if args.node_rank != 0:
        raise RunUsageError(f"--node-rank {args.node_rank}: ftsup run is one machine; {MULTI_MACHINE}")
    if not _is_loopback(args.master_addr):
        raise RunUsageError(f"--master-addr {args.master_addr}: ftsup run is one machine; {MULTI_MACHINE}")
    if args.spares and not args.local_nodes:
        raise RunUsageError("--spares needs --local-nodes (spares are simulated nodes on this machine)")
    if not 0 <= args.spares <= 16:
        raise RunUsageError(f"--spares must be within [0, 16], got {args.spares}")
    if not 0 <= args.max_restarts <= 1_000_000:
        raise RunUsageError(f"--max-restarts must be within [0, 1000000], got {args.max_restarts}")
    if not 0 <= args.sigterm_grace_s <= 3600:
        raise RunUsageError(f"--sigterm-grace-s must be within [0, 3600], got {args.sigterm_grace_s}")
    if args.master_port is not None and not 1024 <= args.master_port <= 65534:
        raise RunUsageError(f"--master-port must be within [1024, 65534], got {args.master_port}")
    if args.module and args.no_python:
        raise RunUsageError("-m and --no-python exclude each other")
    command: tuple[str, ...]
    if args.module:
        command = (python, "-m", args.script)
    elif args.no_python:
        command = (args.script,)
    else:
        command = (python, args.script)
    return RunSpec(
        nnodes=nnodes, nproc_per_node=nproc, max_restarts=args.max_restarts, argv=(*command, *args.args),
        local_nodes=args.local_nodes, spares=args.spares, run_dir=args.run_dir, log_dir=args.log_dir,
        job_name=args.job_name, sigterm_grace_s=args.sigterm_grace_s, master_port=args.master_port,
        tee=args.tee, is_json=args.json, is_dry_run=args.dry_run,
    )


def _is_loopback(host: str) -> bool:
    return tls.is_loopback(f"{host}:0")


def job_dict(spec: RunSpec, cwd: str) -> dict[str, Any]:
    """The job file for this run: the same keys a production job file uses (supervisor/config.py)."""
    job: dict[str, Any] = {
        "name": spec.job_name,
        "nodes": spec.nnodes,
        "ranks_per_node": spec.nproc_per_node,
        "argv": list(spec.argv),
        "env": {},
        "cwd": cwd,
        "max_restarts": spec.max_restarts,
        "sigterm_grace_s": spec.sigterm_grace_s,
    }
    if spec.master_port is not None:
        job.update(master_port_base=spec.master_port, master_port_span=1)
    return job
