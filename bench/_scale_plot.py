"""`ftsup bench scale --plot FILE.png`: heartbeat latency (p50, p99) and supervisor CPU against
fleet size, from one scale result (the object `ftsup bench scale` prints; `--from-json` reads a
saved one instead of running). Not a benchmark itself (the leading underscore keeps it off
`ftsup bench`'s list).

Every measured run is a point: the full fleet at each heartbeat interval ("runs") and the 1 s
sweep of smaller fleets ("sweep_1s"); a run that broke is listed under "errors", not drawn.
"""

from __future__ import annotations

import pathlib
from typing import Any

from ftsup.common import plot


def plot_data(result: dict[str, Any]) -> dict[str, Any]:
    """Per heartbeat interval (seconds, as text): nodes ascending with p50/p99 ms and CPU share."""
    runs = [*result.get("runs", {}).values(), *result.get("sweep_1s", {}).values()]
    points: dict[str, dict[int, dict[str, Any]]] = {}
    errors: list[dict[str, Any]] = []
    for run in runs:
        interval = f"{run['heartbeat_interval_s']:g}"
        if run.get("error") or run.get("latency_p99_ms") is None:
            errors.append({"interval_s": interval, "nodes": run["nodes"], "error": run.get("error", "no latency")})
            continue
        points.setdefault(interval, {})[run["nodes"]] = run
    series = {}
    for interval in sorted(points, key=float):
        by_nodes = points[interval]
        nodes = sorted(by_nodes)
        series[interval] = {
            "nodes": nodes,
            "latency_p50_ms": [by_nodes[n]["latency_p50_ms"] for n in nodes],
            "latency_p99_ms": [by_nodes[n]["latency_p99_ms"] for n in nodes],
            "supervisor_cpu_fraction": [by_nodes[n]["supervisor_cpu_fraction"] for n in nodes],
        }
    goal = result.get("goal", {})
    return {"series": series, "errors": errors, "goal_p99_ms": goal.get("latency_p99_ms"),
            "cpus": result.get("cpus")}


def draw(data: dict[str, Any], target: pathlib.Path) -> None:
    plt = plot.pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for interval, s in data["series"].items():
        line = left.plot(s["nodes"], s["latency_p99_ms"], marker="o", label=f"p99, {interval} s heartbeats")
        left.plot(s["nodes"], s["latency_p50_ms"], marker=".", linestyle="--", color=line[0].get_color(),
                  label=f"p50, {interval} s heartbeats")
        right.plot(s["nodes"], [100 * c for c in s["supervisor_cpu_fraction"]], marker="o",
                   label=f"{interval} s heartbeats")
    if data["goal_p99_ms"] is not None:
        left.axhline(data["goal_p99_ms"], color="#e53935", linestyle=":", label=f"goal: p99 {data['goal_p99_ms']:g} ms")
    for axis, title, ylabel in ((left, "Heartbeat latency (send to ack)", "ms"),
                                (right, "Supervisor CPU", "% of one core")):
        axis.set_xlabel("nodes")
        axis.set_ylabel(ylabel)
        axis.set_title(title)
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    notes = []
    if data["cpus"]:
        notes.append(f"measured on {data['cpus']} CPUs shared with the load generators")
    if data["errors"]:
        notes.append("broke: " + "; ".join(f"{e['nodes']:,} nodes at {e['interval_s']} s" for e in data["errors"]))
    if notes:
        figure.text(0.01, -0.04, "   ".join(notes), fontsize=8)  # below the axes labels
    plot.save(figure, target)
