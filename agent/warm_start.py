"""A pre-warmed trainer process: pays Python's and torch's start-up before it is needed.

Most of a restart is start-up, not training: `import torch` and the first optimizer constructor
(which imports torch._dynamo) cost seconds per rank, and every rank of a node pays them at once.
The agent keeps a few of these processes idle; on a launch it writes one JSON line on stdin
(`{"argv": [...], "env": {...}, "log_path": "..."}`) and the process becomes that trainer: output
goes to the rank's log, the environment is replaced, and the module or script runs as __main__.
Run as `python -m ftsup.agent.warm_start [--preload-nice N] [MODULE...]` (extra modules to import
ahead). With `--preload-nice` (the pool's refill, made while a generation trains beside it) the
imports run in a thread of their own at nice N: a few CPU-seconds per process that must
not come out of the training's share of the cores. Linux keeps a nice value per thread, so the
main thread, which becomes the trainer, keeps its priority (an unprivileged process could never
lower its nice value back); threads the imports start inherit the low priority (torch starts one
idle helper; its compute threads start with the first parallel operation, on the trainer's thread).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import sys
import threading

PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.optim", "torch._dynamo")
PRELOAD_NICE_FLAG = "--preload-nice"


def _preload(modules: list[str]) -> None:
    for name in [*PRELOAD, *modules]:
        try:
            importlib.import_module(name)
        except Exception as exc:
            print(f"warm start: could not preload {name}: {exc!r}", file=sys.stderr, flush=True)


class BackgroundPreload:
    """The imports on a thread of their own at nice `nice` (Linux keeps a nice value per thread:
    this process's main thread keeps its own)."""

    def __init__(self, modules: list[str], nice: int) -> None:
        self._started = threading.Event()
        self.native_id = 0
        self._thread = threading.Thread(target=self._run, args=(modules, nice), name="warm-preload", daemon=True)
        self._thread.start()
        self._started.wait()

    def _run(self, modules: list[str], nice: int) -> None:
        self.native_id = threading.get_native_id()
        with contextlib.suppress(OSError):  # raising one's own nice value is always allowed
            os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))  # 0: this thread
        self._started.set()
        _preload(modules)

    def finish(self) -> None:
        """A launch came (or the pool closed): give the imports' thread the caller's priority back
        where allowed (CAP_SYS_NICE or RLIMIT_NICE; otherwise they finish at their own), and wait
        for them: the trainer's own imports would wait on their locks anyway."""
        if self._thread.is_alive():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self.native_id, os.getpriority(os.PRIO_PROCESS, 0))
        self._thread.join()


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
    if len(argv) >= 3 and argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    elif len(argv) >= 2 and argv[1].endswith(".py"):
        sys.argv = argv[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[1])))
        runpy.run_path(argv[1], run_name="__main__")
    else:
        raise SystemExit(f"warm start cannot run {argv!r}: only `python -m MODULE` or `python SCRIPT.py`")


def parse_argv(argv: list[str]) -> tuple[int | None, list[str]]:
    """`[--preload-nice N] [MODULE...]` -> (N or None, modules)."""
    if argv[:1] == [PRELOAD_NICE_FLAG]:
        if len(argv) < 2 or not argv[1].isdigit() or int(argv[1]) > 19:
            raise SystemExit(f"warm start: {PRELOAD_NICE_FLAG} needs a nice value within [0, 19], got {argv[1:2]}")
        return int(argv[1]), argv[2:]
    return None, argv


def main() -> None:
    nice, modules = parse_argv(sys.argv[1:])
    background = BackgroundPreload(modules, nice) if nice is not None else None
    if background is None:
        _preload(modules)
    line = sys.stdin.readline()
    if background is not None:
        background.finish()
    if not line:
        return  # the agent closed the pool: exit quietly
    launch = json.loads(line)
    _redirect_output(launch["log_path"])
    become(list(launch["argv"]), dict(launch["env"]))


if __name__ == "__main__":
    main()
