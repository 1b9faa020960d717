"""The one seam through which the agent touches OS processes (STYLE 13).

`ProcessRunner` spawns, signals and reaps trainer processes; `AsyncioProcessRunner` is the real
one, `agent.fakes.ScriptedProcessRunner` the in-memory twin for unit tests. Trainers stay in the
agent's process group (no new session): killing the node's process group must kill them too.
"""

from __future__ import annotations

import asyncio
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


@dataclass(eq=False)
class AsyncioHandle:
    process: asyncio.subprocess.Process
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int:
        return self.process.pid


class AsyncioProcessRunner:
    def __init__(self, nice: int = 0) -> None:
        self._nice = nice

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                    cwd: Path | None = None) -> ProcessHandle:
        if not argv:
            raise SpawnFailed("empty trainer argv")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=False,
                    cwd=cwd,
                )
            except OSError as exc:
                raise SpawnFailed(f"cannot start {argv[0]!r}: {exc}") from exc
        if self._nice:
            # Set from outside, after the fork: running Python in a forked child of a gRPC
            # process (preexec_fn) can crash it. The window before this call is microseconds.
            try:
                os.setpriority(os.PRIO_PROCESS, process.pid, self._nice)
            except OSError:
                pass
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
