"""Status page memory over a long follow: a headless browser on a synthetic fleet's page for 10 min.

The page (supervisor/web/) must hold a 12,500-node fleet for days in an operator's tab, so what
it keeps must be bounded by design, not by luck: this follows a steady churn of records (nodes
falling suspect, dying, clearing, coming back) for --duration-s and samples the page's JS heap
after a forced collection, its DOM size and the events it holds. Baseline in the same run: the
same page idle (nothing appended) for --baseline-s first, so heap drift that is not the follow's
is visible. The fleet and the server are harness/status_load.py's (the real core folds every
record; the real status server streams them); the browser is harness/browser.py's Chromium.
Prints one JSON object; the slope of a least-squares line through the follow's samples
(MB per minute) is the number to watch.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from typing import Any

from ftsup.common import logs
from ftsup.harness.browser import Browser, BrowserError
from ftsup.harness.status_load import SyntheticStatus
from ftsup.supervisor.core.events import NodeCleared, NodeDeclaredDead, NodeRegistered, NodeRole, NodeSuspected

ROUND_NODES = 100  # nodes touched per round: all fall suspect, half die, half clear
COME_BACK_AFTER = 10  # rounds after which a dead node registers again (the dead stay ~500)
DOM_NODES = "document.getElementsByTagName('*').length"


def _progress(message: str) -> None:
    print(f"[bench status_page] {message}", file=sys.stderr, flush=True)


def churn(fleet: SyntheticStatus, round_: int) -> int:
    """One round of records; returns how many were appended."""
    nodes = fleet.nodes
    ids = [f"node-{(round_ * ROUND_NODES + i) % nodes:05d}" for i in range(ROUND_NODES)]
    fleet.append([NodeSuspected(n, "silent", 1.0) for n in ids])
    dying = ids[:ROUND_NODES // 2]
    fleet.append([NodeDeclaredDead(n, "silent", 2.0) for n in dying] + [NodeCleared(n, "heard again") for n in ids[ROUND_NODES // 2:]])
    appended = 2 * ROUND_NODES
    if round_ >= COME_BACK_AFTER:
        back = [f"node-{((round_ - COME_BACK_AFTER) * ROUND_NODES + i) % nodes:05d}" for i in range(ROUND_NODES // 2)]
        fleet.append([NodeRegistered(n, 1, NodeRole.ACTIVE, "10.0.0.1", 9000, 8,
                                     failure_domain=f"rack-{int(n[5:]) // 32:04d}") for n in back])
        appended += len(back)
    return appended


def sample(browser: Browser, fleet: SyntheticStatus, started: float) -> dict[str, Any]:
    heap = browser.heap_bytes()
    data = browser.data()
    log_head = fleet.runtime.event_log.head_seq if fleet.runtime else 0
    page_head = int(data.get("headSeq", 0) or 0)
    return {"t_s": round(time.monotonic() - started, 1), "heap_mb": round(heap / 1e6, 3),
            "dom_nodes": int(browser.evaluate(DOM_NODES)), "events_held": int(data.get("eventsHeld", 0) or 0),
            "page_head_seq": page_head, "log_head_seq": log_head, "lag_records": max(0, log_head - page_head)}


def slope_mb_per_min(samples: list[dict[str, Any]]) -> float | None:
    """Least-squares slope of heap against time; None with fewer than 3 samples."""
    if len(samples) < 3:
        return None
    xs = [s["t_s"] / 60 for s in samples]
    ys = [s["heap_mb"] for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread, 4) if spread else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    appended = 0
    with SyntheticStatus(nodes=args.nodes, spares=args.spares) as fleet, Browser() as browser:
        browser.open(fleet.url)
        painted = browser.wait_for_data(lambda d: d.get("firstPaintMs") and d.get("connected") == "1", 60,
                                        "the first paint")
        started = time.monotonic()
        idle = [sample(browser, fleet, started)]
        while time.monotonic() - started < args.baseline_s:
            time.sleep(min(args.sample_s, max(0.0, args.baseline_s - (time.monotonic() - started))))
            idle.append(sample(browser, fleet, started))
        _progress(f"idle baseline: heap {idle[0]['heap_mb']} -> {idle[-1]['heap_mb']} MB")
        follow: list[dict[str, Any]] = []
        round_ = 0
        follow_started = time.monotonic()
        next_sample = follow_started + args.sample_s
        while (now := time.monotonic()) - follow_started < args.duration_s:
            appended += churn(fleet, round_)
            round_ += 1
            if now >= next_sample:
                follow.append(sample(browser, fleet, started))
                next_sample += args.sample_s
                _progress(f"{follow[-1]['t_s']:.0f}s: heap {follow[-1]['heap_mb']} MB, {appended} records,"
                          f" lag {follow[-1]['lag_records']}")
            time.sleep(max(0.0, follow_started + round_ * args.round_s - time.monotonic()))
        head = fleet.runtime.event_log.head_seq if fleet.runtime else 0
        browser.wait_for_data(lambda d: int(d.get("headSeq", 0) or 0) >= head, 120, "the page to catch up")
        follow.append(sample(browser, fleet, started))
        follow_s = time.monotonic() - follow_started
    heaps = [s["heap_mb"] for s in follow]
    return {
        "nodes": args.nodes + args.spares,
        "first_paint_ms": int(painted["firstPaintMs"]),
        "follow_s": round(follow_s, 1),
        "records_appended": appended,
        "records_per_s": round(appended / follow_s, 1),
        "heap_mb_start": heaps[0] if heaps else None,
        "heap_mb_end": heaps[-1] if heaps else None,
        "heap_mb_max": max(heaps) if heaps else None,
        "heap_slope_mb_per_min": slope_mb_per_min(follow),
        "dom_nodes_max": max(s["dom_nodes"] for s in follow) if follow else None,
        "events_held_max": max(s["events_held"] for s in follow) if follow else None,
        "lag_records_max": max(s["lag_records"] for s in follow) if follow else None,
        "baseline": {"name": "the same page idle (nothing appended) before the follow",
                     "duration_s": args.baseline_s, "heap_mb_start": idle[0]["heap_mb"],
                     "heap_mb_end": idle[-1]["heap_mb"], "heap_slope_mb_per_min": slope_mb_per_min(idle)},
        "heap_definition": "JS heap in use (Runtime.getHeapUsage usedSize) right after HeapProfiler.collectGarbage",
        "samples": follow,
        "idle_samples": idle,
        "machine_loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench status_page", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--nodes", type=int, default=12_000, help="active nodes (default 12000)")
    parser.add_argument("--spares", type=int, default=500, help="spare nodes (default 500)")
    parser.add_argument("--duration-s", type=float, default=600.0, help="length of the follow (default 600)")
    parser.add_argument("--baseline-s", type=float, default=60.0, help="idle page first (default 60)")
    parser.add_argument("--round-s", type=float, default=1.0,
                        help=f"seconds between churn rounds of {2 * ROUND_NODES}-{2 * ROUND_NODES + ROUND_NODES // 2}"
                             " records (default 1)")
    parser.add_argument("--sample-s", type=float, default=30.0, help="seconds between heap samples (default 30)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2,000 nodes, 12 s follow, 3 s baseline")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.spares, args.duration_s, args.baseline_s, args.sample_s = 2000, 100, 12.0, 3.0, 3.0
    if not (ROUND_NODES * (COME_BACK_AFTER + 1) <= args.nodes <= 100_000 and args.spares >= 0):
        parser.error(f"--nodes must be within [{ROUND_NODES * (COME_BACK_AFTER + 1)}, 100000] (the churn cycles"
                     f" through {ROUND_NODES * COME_BACK_AFTER} dead nodes), got {args.nodes}")
    if args.duration_s <= 0 or args.baseline_s < 0 or args.round_s <= 0 or args.sample_s <= 0:
        parser.error("--duration-s, --round-s and --sample-s must be positive, --baseline-s not negative")
    logs.configure(level="warning")  # stderr: stdout is the one JSON object
    try:
        result = run(args)
    except BrowserError as exc:
        print(f"ftsup bench status_page: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(result)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
