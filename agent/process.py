"""The one seam through which the agent touches OS processes (STYLE 13).

`ProcessRunner` spawns, signals and reaps trainer processes; `AsyncioProcessRunner` is the real
one, `agent.fakes.ScriptedProcessRunner` the in-memory twin for unit tests. Trainers stay in the
agent's process group (no new session): killing the node's process group must kill them too.

Trainers are the memory hogs and the cheap loss (a rank restores from the agent's RAM), the agent
the expensive one (it holds every snapshot): each trainer gets oom_score_adj TRAINER_OOM_SCORE_ADJ,
above the agent's (the unit sets OOMScoreAdjust=-500), so the kernel's OOM killer picks a trainer
first. Raising a score needs no privilege. The agent's ambient capabilities (CAP_SYSLOG, to read
/dev/kmsg) are cleared at start (`drop_ambient_capabilities`): the agent keeps them, trainers —
the job's code — do not inherit them across execve.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal as signals
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class ProcessHandle(Protocol):
    @property
    def pid(self) -> int: ...


class ProcessRunner(Protocol):
    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                    cwd: Path | None = None) -> ProcessHandle:
        """Starts `argv` with exactly `env` in `cwd` (None: the agent's), stdout and stderr appended to `log_path`."""
        ...

    def signal(self, handle: ProcessHandle, sig: int) -> None:
        """Sends `sig`; a process that already exited is not an error."""
        ...

    async def wait(self, handle: ProcessHandle) -> int:
        """Waits for exit; returns the exit code, negative for the killing signal."""
        ...


class SpawnFailed(OSError):
    """The trainer command could not be started (missing binary, bad cwd...)."""


# The kernel's OOM killer prefers higher scores (-1000..1000); the agent runs at -500 (its unit).
TRAINER_OOM_SCORE_ADJ = 300

_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


def drop_ambient_capabilities() -> bool:
    """Clears this thread's ambient capability set, so processes it starts inherit none (the
    agent's own permitted and effective sets stay). Call it on the thread that spawns trainers
    (the event loop's), before any other thread starts. True when done; False where prctl is
    unavailable (not Linux): best effort, as nothing then was ambient to begin with."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def with_oom_score(argv: Sequence[str], oom_score_adj: int) -> list[str]:
    """`argv` run through /bin/sh, which sets its own oom_score_adj and then execs `argv` (same
    pid, same argv): the score is in place before the trainer's first instruction, with no Python
    running in the forked child (preexec_fn can crash a gRPC process). A failed write (an older
    kernel, a read-only /proc) is ignored: best effort."""
    script = f'{{ echo {int(oom_score_adj)} > /proc/self/oom_score_adj; }} 2>/dev/null; exec "$@"'
    return ["/bin/sh", "-c", script, str(argv[0]), *argv]


def adjust_child(pid: int, *, nice: int = 0, oom_score_adj: int | None = None) -> None:
    """Lowers a started child's CPU priority and raises its OOM score, from outside (the idle warm
    pool's processes; trainers get their score from `with_oom_score`). Best effort: a child that
    already exited is no error."""
    if nice:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, nice)
    if oom_score_adj is not None:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write(str(oom_score_adj))


@dataclass(eq=False)
class AsyncioHandle:
    process: asyncio.subprocess.Process
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int:
        return self.process.pid


class AsyncioProcessRunner:
    def __init__(self, nice: int = 0, oom_score_adj: int | None = TRAINER_OOM_SCORE_ADJ) -> None:
        self._nice = nice
        self._oom_score_adj = oom_score_adj

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                    cwd: Path | None = None) -> ProcessHandle:
        if not argv:
            raise SpawnFailed("empty trainer argv")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            try:
                process = await asyncio.create_subprocess_exec(
                    *(with_oom_score(argv, self._oom_score_adj) if self._oom_score_adj is not None else argv),
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=False,
                    cwd=cwd,
                )
            except OSError as exc:
                raise SpawnFailed(f"cannot start {argv[0]!r}: {exc}") from exc
        adjust_child(process.pid, nice=self._nice)
        return AsyncioHandle(process)

    def signal(self, handle: ProcessHandle, sig: int) -> None:
        assert isinstance(handle, AsyncioHandle)
        if handle.process.returncode is not None:
            return
        try:
            handle.process.send_signal(signals.Signals(sig))
        except ProcessLookupError:
            pass

    async def wait(self, handle: ProcessHandle) -> int:
        assert isinstance(handle, AsyncioHandle)
        return await handle.process.wait()


def default_base_env() -> dict[str, str]:
    """The agent's own environment, inherited by trainers (PATH, virtualenv, CUDA settings...)."""
    return dict(os.environ)
