"""A status page over a synthetic fleet (12,500 nodes by default), for the page's load test and bench.

The fleet is made of real events folded by the real core: NodeRegistered per node (grouped in
failure domains), one GenerationStarted over the active ones, then whatever the caller appends
(deaths, suspicions) while a browser follows. The runtime is not run (nothing decides); records
are appended to an in-memory log and folded into its state, as the runtime's follower does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.events import (
    Event,
    GenerationRunning,
    GenerationStarted,
    NodeRegistered,
    NodeRole,
    RankAssignment,
)
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.web.server import serve_status


def fleet_events(nodes: int, spares: int, per_domain: int = 32, ranks_per_node: int = 8) -> list[Event]:
    events: list[Event] = []
    members = []
    for i in range(nodes + spares):
        is_spare = i >= nodes
        node_id = f"spare-{i - nodes:05d}" if is_spare else f"node-{i:05d}"
        events.append(NodeRegistered(node_id, 1, NodeRole.SPARE if is_spare else NodeRole.ACTIVE,
                                     f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 9000, ranks_per_node,
                                     failure_domain=f"rack-{i // per_domain:04d}"))
        if not is_spare:
            buddy = f"node-{(i + 1) % nodes:05d}"
            members.append(RankAssignment(node_id, tuple(range(i * ranks_per_node, (i + 1) * ranks_per_node)), buddy))
    events.append(GenerationStarted(1, tuple(members), nodes * ranks_per_node, "10.0.0.0", 29500, None, 0, (),
                                    "synthetic fleet"))
    events.append(GenerationRunning(1, 1))
    return events


class SyntheticStatus:
    """Serves the status page of a synthetic fleet from a thread; `append` adds records live."""

    def __init__(self, nodes: int = 12_000, spares: int = 500) -> None:
        self.nodes, self.spares = nodes, spares
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready: Future[str] = Future()
        self.runtime: Runtime | None = None

    def __enter__(self) -> SyntheticStatus:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        self.url = self._ready.result(timeout=120)
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    async def _serve_setup(self) -> Runtime:
        """Builds the runtime and folds the fleet in, on the running loop."""
        config = CoreConfig(job=JobSpec(name="synthetic", nodes=self.nodes, ranks_per_node=8, argv=("train",)),
                            detector=DetectorConfig())
        self.runtime = Runtime(config, MemoryLog())
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        await self._append(fleet_events(self.nodes, self.spares))
        return self.runtime

    async def _serve(self) -> None:
        try:
            await self._serve_setup()
            assert self.runtime is not None and self._stop is not None
            server = await serve_status(self.runtime, "127.0.0.1:0")
        except BaseException as exc:
            self._ready.set_exception(exc)
            raise
        port = server.sockets[0].getsockname()[1]
        self._ready.set_result(f"http://127.0.0.1:{port}/status")
        await self._stop.wait()
        server.close()

    async def _append(self, events: Sequence[Event]) -> None:
        assert self.runtime is not None
        records = await self.runtime.event_log.append(events, term=0, time_unix_s=time.time())
        self.runtime.core.fold(records, clock_offset_s=time.monotonic() - time.time())

    def append(self, events: Sequence[Event]) -> None:
        """Appends and folds `events` on the server's loop; returns once they are in the log."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._append(events), self._loop).result(timeout=30)
