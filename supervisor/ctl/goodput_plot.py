"""`supervisorctl goodput --plot FILE.png`: the goodput breakdown over time, from the event log.

`supervisorctl goodput` gives the totals now; this replays the log through the same fold the
supervisor keeps (supervisor/core/goodput.py) and reads it at evenly spaced times, so each point
is what `goodput` would have printed then: seconds per bucket stacked up to the wall time, the
ETTR beside them, and each interrupted generation marked. Lost work is charged when the restore
that throws it away happens, so productive time can step down at an interruption: that is the
accounting, not a glitch. "Now" is the supervisor's (GetGoodput's until_unix_s): no clock skew
between this shell and the supervisor bends the last point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

from ftsup.common import plot
from ftsup.supervisor import codec
from ftsup.supervisor.core.events import EndReason, GenerationEnded, Record
from ftsup.supervisor.core.goodput import GoodputAccount
from ftsup.v1 import operator_pb2, operator_pb2_grpc

BUCKETS = ("productive", "detection", "restart", "lost_work", "waiting")  # stacking order, bottom up
SAMPLES = 200
EXIT_OK = 0
EXIT_USAGE = 2


def series(records: Iterable[Record], now_unix_s: float, samples: int = SAMPLES) -> dict[str, Any]:
    """The report at `samples` evenly spaced times from where accounting starts until now (or the
    job's completion): seconds since the start, each bucket's seconds, the ETTR, interruptions."""
    ordered = sorted(records, key=lambda r: r.seq)
    whole = GoodputAccount()
    for record in ordered:
        whole.add(record)
    final = whole.report(now_unix_s)
    empty: dict[str, Any] = {"since_unix_s": None, "t_s": [], "buckets_s": {b: [] for b in BUCKETS}, "ettr": [],
                             "interruptions": [], "first_seq": final.first_seq}
    if final.since_unix_s is None:
        return empty
    start, until = final.since_unix_s, final.until_unix_s
    times = [start + (until - start) * i / (samples - 1) for i in range(samples)] if samples > 1 else [until]
    account = GoodputAccount()
    out = {**empty, "since_unix_s": start, "buckets_s": {b: [] for b in BUCKETS}}
    pending = iter(ordered)
    upcoming = next(pending, None)
    for t in times:
        while upcoming is not None and upcoming.time_unix_s <= t:
            account.add(upcoming)
            upcoming = next(pending, None)
        report = account.report(t)
        out["t_s"].append(t - start)
        for bucket in BUCKETS:
            out["buckets_s"][bucket].append(getattr(report, f"{bucket}_s"))
        out["ettr"].append(report.ettr)
    out["interruptions"] = [
        {"t_s": r.time_unix_s - start, "generation": r.event.generation, "reason": r.event.reason.value}
        for r in ordered
        if isinstance(r.event, GenerationEnded) and r.event.reason is not EndReason.COMPLETED
        and r.time_unix_s >= start
    ]
    return out


def _unit(total_s: float) -> tuple[float, str]:
    if total_s >= 3 * 3600:
        return 3600.0, "hours"
    if total_s >= 180:
        return 60.0, "minutes"
    return 1.0, "seconds"


def draw(data: dict[str, Any], target: str | os.PathLike[str], title: str = "") -> None:
    plt = plot.pyplot()
    figure, axis = plt.subplots(figsize=(11, 5))
    total = data["t_s"][-1] if data["t_s"] else 0.0
    scale, unit = _unit(total)
    x = [t / scale for t in data["t_s"]]
    axis.stackplot(x, *[[v / scale for v in data["buckets_s"][b]] for b in BUCKETS],
                   labels=[b.replace("_", " ") for b in BUCKETS], colors=[plot.BUCKET_COLOURS[b] for b in BUCKETS],
                   alpha=0.85)
    for i, stop in enumerate(data["interruptions"]):
        axis.axvline(stop["t_s"] / scale, color="#424242", linestyle=":", linewidth=1,
                     label="interrupted generation" if i == 0 else None)
        axis.annotate(f"g{stop['generation']} {stop['reason']}", (stop["t_s"] / scale, 1.0), xycoords=("data", "axes fraction"),
                      rotation=90, va="top", ha="right", fontsize=7)
    axis.set_xlabel(f"{unit} since accounting started")
    axis.set_ylabel(f"{unit}, stacked (sum = wall time)")
    axis.set_xlim(0, max(x[-1], 1e-9) if x else 1)
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    ratio = axis.twinx()
    ratio.plot(x, [e if e is not None else float("nan") for e in data["ettr"]], color="black", linewidth=1.5,
               label="ETTR (right axis)")
    ratio.set_ylim(0, 1.05)
    ratio.set_ylabel("ETTR")
    handles, labels = axis.get_legend_handles_labels()
    more, more_labels = ratio.get_legend_handles_labels()
    axis.legend(handles + more, labels + more_labels, fontsize=8, loc="upper left")
    last = data["ettr"][-1] if data["ettr"] else None
    axis.set_title(f"Goodput over time{' — ' + title if title else ''}"
                   + (f" (ETTR now {last:.1%})" if last is not None else ""))
    plot.save(figure, target)


def cmd_goodput_plot(stub: operator_pb2_grpc.OperatorStub, args: argparse.Namespace) -> int:
    try:
        target = plot.check_target(args.plot)
        plot.pyplot()
    except (ValueError, plot.PlotUnavailable) as exc:
        print(f"supervisorctl goodput: {exc}", file=sys.stderr)
        return EXIT_USAGE
    now = stub.GetGoodput(operator_pb2.GetGoodputRequest(), timeout=args.timeout).until_unix_s
    job = stub.GetStatus(operator_pb2.GetStatusRequest(), timeout=args.timeout).job_name
    stream = stub.ListEvents(operator_pb2.ListEventsRequest(since_seq=1, follow=False), timeout=args.timeout)
    records = []
    for message in stream:
        try:
            records.append(codec.record_from_proto(message))
        except codec.CodecError:
            continue  # a kind this build does not know (a newer supervisor): goodput ignores it too
    data = series(records, now)
    draw(data, target, job)
    if args.json:
        print(json.dumps({"plot": str(target), **data}), flush=True)
    else:
        print(f"goodput: wrote {target} ({len(data['t_s'])} points over {len(records)} records)")
    return EXIT_OK
