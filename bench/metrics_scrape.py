"""What one Prometheus scrape of /metrics costs the leader's loop at fleet size: per-node series up to
the limit, against every node's, in one run.

A scrape is answered on the leader's event loop (common/metrics_http.py): while the exposition is
written, no input is decided. Per-node gauges (Xids, straggler score, heartbeat age) are three
series per node, 37,500 at 12,500 nodes. Past `--metrics-per-node-limit` (default 1024) each gauge
lists only its worst nodes (supervisor/metrics.py). This bench runs the real Runtime on an
in-memory log with N in-process streams, starts a generation of N nodes, a few of them with Xids,
and times (time.process_time) the scrape's work, `refresh` and the exposition, alternating the
limited registry with one whose limit holds every node (the baseline: every scrape before
2026-11-29). Also: samples and bytes per scrape.

    ftsup bench metrics-scrape --json                  # 12,500 nodes
    ftsup bench metrics-scrape --nodes 1000 --repeats 3 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from prometheus_client import generate_latest

from ftsup.bench import _runtime_fleet
from ftsup.common import logs
from ftsup.supervisor.core.inputs import XidReport
from ftsup.supervisor.metrics import SupervisorMetrics, ThroughputConfig
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime

XID_NODES = 5  # nodes that report an Xid each (a non-fatal code: they stay in the job)


async def _fleet(nodes: int) -> tuple[Runtime, asyncio.Task[None]]:
    runtime, loop = await _runtime_fleet.start([StreamOutbox() for _ in range(nodes)])
    for i in range(min(XID_NODES, nodes)):
        outcome = await runtime.submit(XidReport(f"node-{i:05d}", "0000:01:00.0", 0, 63, "row remapping pending"))
        if outcome.refusal is not None:
            raise RuntimeError(f"Xid refused: {outcome.refusal}")
    return runtime, loop


async def _scrape(metrics: SupervisorMetrics) -> tuple[float, bytes]:
    started = time.process_time()
    await metrics.refresh()
    body = generate_latest(metrics.registry)
    return time.process_time() - started, body


async def _run(nodes: int, limit: int, repeats: int) -> dict[str, Any]:
    runtime, loop = await _fleet(nodes)
    try:
        limited, whole = (SupervisorMetrics(ThroughputConfig(per_node_limit=n)) for n in (limit, nodes))
        limited.attach(runtime)
        whole.attach(runtime)
        times: dict[str, list[float]] = {"limited": [], "whole": []}
        bodies: dict[str, bytes] = {}
        for _ in range(repeats):
            for name, metrics in (("limited", limited), ("whole", whole)):
                cpu_s, bodies[name] = await _scrape(metrics)
                times[name].append(cpu_s)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)

    def summary(name: str) -> dict[str, Any]:
        body = bodies[name]
        samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        return {"median_cpu_s": round(statistics.median(times[name]), 4),
                "samples_s": [round(s, 4) for s in times[name]], "samples": samples, "bytes": len(body),
                "node_xid_series": body.count(b"ftsup_node_xids{")}

    limited_summary, whole_summary = summary("limited"), summary("whole")
    return {"nodes": nodes, "per_node_limit": limit, "repeats": repeats, "limited": limited_summary,
            "baseline_every_node": whole_summary,
            "speedup": round(whole_summary["median_cpu_s"] / max(limited_summary["median_cpu_s"], 1e-9), 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ftsup bench metrics-scrape", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    p.add_argument("--nodes", type=int, default=12_500)
    p.add_argument("--limit", type=int, default=ThroughputConfig().per_node_limit,
                   help="the per-node series limit measured (the baseline's holds every node)")
    p.add_argument("--repeats", type=int, default=5, help="scrapes of each registry (they alternate)")
    args = p.parse_args(argv)
    if args.nodes < 1 or args.limit < 0 or args.repeats < 1:
        p.error("--nodes and --repeats must be >= 1, --limit >= 0")
    logs.configure(level="warning")  # stderr: stdout is the one JSON object
    result = asyncio.run(_run(args.nodes, args.limit, args.repeats))
    print(json.dumps({"what": "CPU of one /metrics scrape on the leader's loop: per-node series up to the limit,"
                              " against every node's", **result}))
    return 0
