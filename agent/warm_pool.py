"""A ProcessRunner that starts Python trainers from pre-warmed processes (agent/warm_start.py).

Wraps the real runner: a launch whose argv is `<this python> -m MODULE ...` or `<this python>
SCRIPT.py ...` takes an idle warm process, when one is ready, and sends it the launch; anything
else, or an empty pool, spawns cold as before. Used processes are replaced after a delay, so the
refill does not compete with the generation that is starting. Idle warm processes hold ~0.3 GB
each (torch imported) and no CPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from ftsup.agent.process import (
    TRAINER_OOM_SCORE_ADJ,
    AsyncioHandle,
    AsyncioProcessRunner,
    ProcessHandle,
    SpawnFailed,
    adjust_child,
)

Logger = structlog.typing.FilteringBoundLogger


def is_warmable(argv: Sequence[str], python: str = sys.executable) -> bool:
    """Only this interpreter running a module or a script can be handed to a warm process."""
    if len(argv) < 2:
        return False
    resolved = shutil.which(argv[0]) or argv[0]
    if os.path.realpath(resolved) != os.path.realpath(python):
        return False
    return (argv[1] == "-m" and len(argv) >= 3) or argv[1].endswith(".py")


class WarmPoolRunner:
    def __init__(
        self,
        inner: AsyncioProcessRunner,
        size: int,
        workdir: Path,
        log: Logger,
        refill_delay_s: float = 5.0,
        nice: int = 0,
    ) -> None:
        self._inner = inner
        self._size = size
        self._workdir = workdir
        self._log = log
        self._refill_delay_s = refill_delay_s
        self._nice = nice
        self._idle: list[AsyncioHandle] = []
        self._spawned = 0
        self._refill: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._fill()

    async def _fill(self) -> None:
        while len(self._idle) < self._size:
            self._spawned += 1
            log_path = self._workdir / f"warm-{self._spawned}.log"
            with open(log_path, "ab") as out:
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "ftsup.agent.warm_start",
                    stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ),
                )
            adjust_child(process.pid, nice=self._nice, oom_score_adj=TRAINER_OOM_SCORE_ADJ)
            self._idle.append(AsyncioHandle(process))
        self._log.debug("warm_pool_filled", idle=len(self._idle))

    async def _refill_later(self) -> None:
        await asyncio.sleep(self._refill_delay_s)
        await self._fill()

    def idle(self) -> int:
        """Warm processes alive and ready now (the metrics page's gauge; a soak checks it refills)."""
        return sum(1 for h in self._idle if h.process.returncode is None)

    def _take(self) -> AsyncioHandle | None:
        while self._idle:
            handle = self._idle.pop(0)
            if handle.process.returncode is None:
                return handle
        return None

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                    cwd: Path | None = None) -> ProcessHandle:
        handle = self._take() if is_warmable(argv) and cwd is None else None  # warm ones sit in the agent's cwd
        if handle is None:
            return await self._inner.spawn(argv, env, log_path, cwd)
        launch = json.dumps({"argv": list(argv), "env": dict(env), "log_path": str(log_path)}) + "\n"
        stdin = handle.process.stdin
        assert stdin is not None
        try:
            stdin.write(launch.encode())
            await stdin.drain()
            stdin.close()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise SpawnFailed(f"warm process {handle.pid} died before launch: {exc}") from exc
        if self._refill is None or self._refill.done():
            self._refill = asyncio.create_task(self._refill_later())
        self._log.info("trainer_warm_started", pid=handle.pid, log=str(log_path))
        return handle

    def signal(self, handle: ProcessHandle, sig: int) -> None:
        self._inner.signal(handle, sig)

    async def wait(self, handle: ProcessHandle) -> int:
        return await self._inner.wait(handle)

    async def close(self) -> None:
        """Ends idle warm processes: closing stdin makes them exit."""
        if self._refill is not None:
            self._refill.cancel()
        for handle in self._idle:
            if handle.process.stdin is not None:
                handle.process.stdin.close()
        await asyncio.gather(*(h.process.wait() for h in self._idle), return_exceptions=True)
        self._idle.clear()
