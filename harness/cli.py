"""`ftsup`: one entry point for the daemons and the tools (run, supervisor, agent, demo, xid, log, bench, checkpoints)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import sys
from collections.abc import Callable

from ftsup.harness.stop_signals import Stopped, unwinding_on_stop_signals


def _run(argv: list[str]) -> int:
    from ftsup.harness.run import main

    return main(argv)


def _supervisor(argv: list[str]) -> int:
    from ftsup.supervisor.main import main

    return main(argv)


def _agent(argv: list[str]) -> int:
    from ftsup.agent.main import main

    return main(argv)


def _demo(argv: list[str]) -> int:
    from ftsup.harness.demo import main

    return main(argv)


def _chaos(argv: list[str]) -> int:
    from ftsup.harness.chaos.main import main

    return main(argv)


def _xid(argv: list[str]) -> int:
    from ftsup.harness.xid_cli import main

    return main(argv)


def _sim(argv: list[str]) -> int:
    from ftsup.harness.sim.cli import main

    return main(argv)


def _log(argv: list[str]) -> int:
    from ftsup.supervisor.eventlog.inspect import main

    return main(argv)


def _checkpoints(argv: list[str]) -> int:
    from ftsup.checkpoint.cli import main

    return main(argv)


def _certs(argv: list[str]) -> int:
    from ftsup.harness.certs import main

    return main(argv)


def _ctl(argv: list[str]) -> int:
    from ftsup.supervisor.ctl.main import main

    return main(argv)


def bench_names() -> dict[str, str]:
    """Benchmarks under bench/ (name -> first docstring line), read without importing them."""
    import ftsup.bench

    names: dict[str, str] = {}
    for path in sorted(pathlib.Path(ftsup.bench.__file__).parent.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        names[path.stem] = doc.strip().splitlines()[0] if doc.strip() else ""
    return names


def _bench(argv: list[str]) -> int:
    names = bench_names()
    if not argv or argv[0] in ("-h", "--help"):
        lines = ["usage: ftsup bench NAME [ARGS...]", "", "benchmarks (each prints one JSON object):"]
        lines += [f"  {name:<11} {doc}" for name, doc in names.items()]
        lines.append("\n`ftsup bench NAME --help` for a benchmark's flags.")
        print("\n".join(lines))
        return 0 if argv else 2
    name = argv[0].replace("-", "_")  # `core-step` names bench/core_step.py
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or name not in names:
        print(f"ftsup bench: unknown benchmark {name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    return importlib.import_module(f"ftsup.bench.{name}").main(argv[1:])


SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "run": (_run, "run a torchrun-style script under ftsup on this machine (torchrun's flags; see --help)"),
    "supervisor": (_supervisor, "run the supervisor daemon"),
    "agent": (_agent, "run the node agent daemon"),
    "demo": (_demo, "train on a local cluster, kill a node, recover (see --help)"),
    "chaos": (_chaos, "break a local cluster in a named way and check recovery (`ftsup chaos --list`)"),
    "xid": (_xid, "list the NVIDIA Xid errors in kernel-log text and the action for each"),
    "log": (_log, "inspect (verify every CRC) or compact a supervisor's embedded event log"),
    "bench": (_bench, "run a benchmark (`ftsup bench --help` lists them)"),
    "sim": (_sim, "simulate a fleet's failures in virtual time through the real core: MTBF, Young/Daly, ETTR"),
    "checkpoints": (_checkpoints, "list a checkpoint store; gc: abort stale multipart uploads, retention (--keep)"),
    "certs": (_certs, "create a lab CA and node/supervisor/operator certificates for mTLS"),
    "ctl": (_ctl, "the operator CLI, same as `supervisorctl` (for hosts where supervisord owns that name)"),
}


# Commands that start child processes (clusters, etcd members, load generators, ranks, workers)
# and stop them on the way out: SIGTERM and SIGHUP unwind them as Ctrl-C does (stop_signals.py).
# The daemons are not here: each has its own graceful shutdown on SIGTERM.
STOPPED_BY_UNWINDING = frozenset({"run", "demo", "chaos", "bench", "sim"})


def usage() -> str:
    lines = ["usage: ftsup COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines.append("\n`ftsup COMMAND --help` for a command's flags; `supervisorctl --help` for the operator CLI.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command = SUBCOMMANDS.get(args[0])
    if command is None:
        print(f"ftsup: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if args[0] not in STOPPED_BY_UNWINDING:
        return command[0](args[1:])
    try:
        with unwinding_on_stop_signals():
            return command[0](args[1:])
    except Stopped as stop:  # the command's own cleanup (its finally blocks) has run by now
        print(f"ftsup {args[0]}: {stop}; the processes it started are stopped", file=sys.stderr)
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
