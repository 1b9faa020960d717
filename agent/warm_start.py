"""A pre-warmed trainer process: pays Python's and torch's start-up before it is needed.

Most of a restart is start-up, not training: `import torch` and the first optimizer constructor
(which imports torch._dynamo) cost seconds per rank, and every rank of a node pays them at once.
The agent keeps a few of these processes idle; on a launch it writes one JSON line on stdin
(`{"argv": [...], "env": {...}, "log_path": "..."}`) and the process becomes that trainer: output
goes to the rank's log, the environment is replaced, and the module or script runs as __main__.
Run as `python -m ftsup.agent.warm_start [MODULE...]` (extra modules to import ahead).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys

from ftsup.common import rendezvous_store

# torch's start-up, and ftsup's trainer library (Session pulls in gRPC and protobuf: ~0.2 s idle,
# ~0.5 s on a loaded node, measured as the example's import_s after a restart).
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.optim", "torch._dynamo",
           "ftsup.trainer.session")


def _preload(modules: list[str]) -> None:
    for name in [*PRELOAD, *modules]:
        try:
            importlib.import_module(name)
        except Exception as exc:
            print(f"warm start: could not preload {name}: {exc!r}", file=sys.stderr, flush=True)


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def become(argv: list[str], env: dict[str, str]) -> None:
    """Runs `python -m module ...` or `python script.py ...` in this process, as its __main__."""
    os.environ.clear()
    os.environ.update(env)
    # Rank 0 listens before the other ranks dial; they wait for it (common/rendezvous_store.py).
    rendezvous_store.prestart(env)
    rendezvous_store.await_host(env)
    if len(argv) >= 3 and argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    elif len(argv) >= 2 and argv[1].endswith(".py"):
        sys.argv = argv[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[1])))
        runpy.run_path(argv[1], run_name="__main__")
    else:
        raise SystemExit(f"warm start cannot run {argv!r}: only `python -m MODULE` or `python SCRIPT.py`")


def main() -> None:
    _preload(sys.argv[1:])
    line = sys.stdin.readline()
    if not line:
        return  # the agent closed the pool: exit quietly
    launch = json.loads(line)
    _redirect_output(launch["log_path"])
    become(list(launch["argv"]), dict(launch["env"]))


if __name__ == "__main__":
    main()
