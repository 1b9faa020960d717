"""A real Runtime on an in-memory log with N in-process agent streams and a generation of them
started: the fleet the in-process leader benches (commit_push, metrics_scrape) measure on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.events import NodeRole
from ftsup.supervisor.core.inputs import AgentHello
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime


async def start(outboxes: Sequence[StreamOutbox], ranks_per_node: int = 8, *,
                takes_snapshot_retain: bool = False) -> tuple[Runtime, asyncio.Task[None]]:
    """The runtime and its running loop (cancel it when done), once a generation of one node per
    outbox (`node-00000`, ...) has started. Verdicts are minutes away: none comes while a bench runs."""
    nodes = len(outboxes)
    config = CoreConfig(job=JobSpec(name="bench", nodes=nodes, ranks_per_node=ranks_per_node, argv=("train",)),
                        detector=DetectorConfig(heartbeat_interval_s=60.0, heartbeat_misses=10,
                                                reconnect_grace_s=60.0),
                        spare_grace_s=0.0)
    runtime = Runtime(config, MemoryLog(), tick_s=1.0)
    loop = asyncio.create_task(runtime.run())
    try:
        hellos = [runtime.submit(AgentHello(f"node-{i:05d}", 1, NodeRole.ACTIVE, f"10.0.{i // 250}.{i % 250}", 29500,
                                            ranks_per_node, runtime.open_stream(outbox),
                                            takes_snapshot_retain=takes_snapshot_retain))
                  for i, outbox in enumerate(outboxes)]
        await asyncio.gather(*hellos)
        deadline = time.monotonic() + 120
        while runtime.state.generation is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no generation started: {runtime.core.waiting_reason}")
            await asyncio.sleep(0.05)
    except BaseException:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        raise
    return runtime, loop
