"""Fleet registration on the leader: Hellos one at a time against Hellos in batches, in one run.

The supervisor's own loop (the real Runtime on a real embedded event log, fsync'd appends) fed
the inputs a connecting fleet sends: N Hellos arriving at `--arrival-per-s`, and from each node's
Welcome on a Heartbeat every `--interval-s` (spread over the interval), with the runtime's Tick.
No gRPC and no simulated agents: this measures what the leader's loop does with a connect burst,
apart from the transport's per-message cost (`ftsup bench scale` measures that, end to end).

The baseline is the same run with `hello_batch=1` (every Hello decided and appended alone, as
before batching). Reported per mode: time to register the fleet, appends, the generation start,
the longest loop stall (a watchdog's lateness), and false verdicts (suspects or deaths of nodes
that never stopped). `--profile` adds the top functions (cumulative) from the first Hello to a settled generation.

    ftsup bench registration --json                     # 12,500 nodes, 5 s heartbeats
    ftsup bench registration --nodes 2000 --quick --json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pathlib
import pstats
import sys
import tempfile
import time
from typing import Any

from ftsup.common import logs
from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.events import NodeDeclaredDead, NodeRole, NodeSuspected
from ftsup.supervisor.core.inputs import AgentHello, Heartbeat
from ftsup.supervisor.eventlog.embedded import EmbeddedLog
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import HELLO_BATCH, Runtime


class _Appends(EmbeddedLog):
    """The embedded log, counting appends and the events in them."""

    appends = 0
    events = 0

    async def append(self, events, **kwargs):
        self.appends += 1
        self.events += len(events)
        return await super().append(events, **kwargs)


async def _watchdog(stalls: list[float], period_s: float = 0.02) -> None:
    while True:
        asked = time.monotonic()
        await asyncio.sleep(period_s)
        stalls.append(time.monotonic() - asked - period_s)


async def _run(args: argparse.Namespace, hello_batch: int, directory: pathlib.Path) -> dict[str, Any]:
    config = CoreConfig(
        job=JobSpec(name="bench", nodes=args.nodes, ranks_per_node=args.ranks_per_node, argv=("train",)),
        detector=DetectorConfig(heartbeat_interval_s=args.interval_s, heartbeat_misses=args.heartbeat_misses,
                                reconnect_grace_s=2 * args.interval_s),
        spare_grace_s=1.0,
    )
    log = _Appends(directory)
    runtime = Runtime(config, log, tick_s=0.1, hello_batch=hello_batch)
    loop_task = asyncio.create_task(runtime.run())
    stalls: list[float] = []
    watchdog = asyncio.create_task(_watchdog(stalls))
    welcomed_at: dict[str, float] = {}
    started = time.monotonic()
    profile = cProfile.Profile() if args.profile else None

    async def hello(i: int) -> None:
        node_id = f"node-{i:06d}"
        inp = AgentHello(node_id, 1, NodeRole.ACTIVE, "10.0.0.1", 7071, 8, runtime.open_stream(StreamOutbox(64)))
        outcome = await (await runtime.submit_from_stream(inp))
        if outcome.refusal is None:
            welcomed_at[node_id] = time.monotonic()

    async def heartbeats() -> None:
        # Each welcomed node beats every interval from its Welcome on (spread by Welcome times).
        sent: dict[str, float] = {}
        while True:
            now = time.monotonic()
            for node_id, at in welcomed_at.items():
                if now - sent.get(node_id, at) >= args.interval_s:
                    sent[node_id] = now
                    await runtime.submit_from_stream(Heartbeat(node_id, 1, 0))
            await asyncio.sleep(0.05)

    beating = asyncio.create_task(heartbeats())
    if profile is not None:
        profile.enable()
    pending = []
    for i in range(args.nodes):  # arrivals at the given rate, in 10 ms slices
        pending.append(asyncio.create_task(hello(i)))
        if (i + 1) % max(1, int(args.arrival_per_s / 100)) == 0:
            await asyncio.sleep(0.01)
    await asyncio.gather(*pending)
    registered_s = time.monotonic() - started
    deadline = time.monotonic() + args.settle_s
    while runtime.state.generation is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    generation_s = time.monotonic() - started if runtime.state.generation is not None else None
    # The generation start's directives and a few heartbeat intervals after it.
    settle_until = time.monotonic() + min(args.settle_s, 2 * args.interval_s)
    while time.monotonic() < settle_until:
        await asyncio.sleep(0.1)
    if profile is not None:
        profile.disable()
    for task in (beating, watchdog, loop_task):
        task.cancel()
    await asyncio.gather(beating, watchdog, loop_task, return_exceptions=True)
    verdicts = [r.event for r in log.read(1) if isinstance(r.event, (NodeSuspected, NodeDeclaredDead))]
    result: dict[str, Any] = {
        "hello_batch": hello_batch,
        "registered": len(welcomed_at),
        "register_s": round(registered_s, 2),
        "hellos_per_s": round(len(welcomed_at) / registered_s, 1) if registered_s > 0 else None,
        "generation_started_s": round(generation_s, 2) if generation_s is not None else None,
        "appends": log.appends,
        "events_appended": log.events,
        "max_loop_stall_s": round(max(stalls, default=0.0), 3),
        "false_suspects": sum(isinstance(e, NodeSuspected) for e in verdicts),
        "false_deaths": sum(isinstance(e, NodeDeclaredDead) for e in verdicts),
    }
    log.close()
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(25)
        result["profile"] = out.getvalue().splitlines()
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup bench registration", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=12_500)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--interval-s", type=float, default=5.0, help="heartbeat interval")
    p.add_argument("--heartbeat-misses", type=int, default=2)
    p.add_argument("--arrival-per-s", type=float, default=2_000.0, help="Hellos arriving per second")
    p.add_argument("--settle-s", type=float, default=30.0, help="longest wait for the generation to start")
    p.add_argument("--batch", type=int, default=HELLO_BATCH, help="the batched mode's hello_batch")
    p.add_argument("--quick", action="store_true", help="batched mode only, no baseline")
    p.add_argument("--profile", action="store_true", help="cProfile from the first Hello to the settled generation")
    p.add_argument("--dir", type=pathlib.Path, default=None, help="where the event logs go (a temp dir)")
    p.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.nodes < 1 or args.interval_s <= 0 or args.arrival_per_s <= 0 or args.batch < 1:
        print("ftsup bench registration: --nodes, --interval-s, --arrival-per-s and --batch must be positive",
              file=sys.stderr)
        return 2
    logs.configure(level="warning")
    modes = [args.batch] if args.quick else [1, args.batch]
    runs = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for batch in modes:
            directory = pathlib.Path(tmp) / f"batch-{batch}"
            runs.append(asyncio.run(_run(args, batch, directory)))
    result = {"bench": "registration", "nodes": args.nodes, "interval_s": args.interval_s,
              "arrival_per_s": args.arrival_per_s, "runs": runs,
              "baseline": runs[0] if not args.quick else None}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
