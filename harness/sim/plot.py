"""`ftsup sim --plot FILE.png`: ETTR against GPUs per strategy with its 95% intervals, and where
each strategy's time goes, from the same result objects `--json` prints.

`plot_data` (pure) picks the numbers; `draw` only lays them out, so a test checks the numbers.
The time breakdown shows the non-productive share stacked by cause, with the productive share
(the ETTR) written above each bar: drawn whole, productive would flatten every cause to a sliver.
"""

from __future__ import annotations

import pathlib
from typing import Any

from ftsup.common import plot

# Engine bucket -> what the legend says, in stacking order (productive is "useful", shown as text).
LOSSES = (
    ("checkpoint_pauses", "checkpoint pauses"),
    ("snapshot_pauses", "snapshot pauses"),
    ("detection", "detection"),
    ("restart", "restart"),
    ("lost_work", "lost work"),
    ("waiting_for_spares", "waiting for spares"),
)


def plot_data(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per strategy: the GPU counts it finished at, its ETTR, 95% interval (None with one run) and
    model expectation; and per (GPU count, strategy) the share of wall time in each bucket.
    Strategies that could not finish at a count are listed under "errors" and left out."""
    ordered = sorted(results, key=lambda r: r["gpus"])
    names = list(dict.fromkeys(name for r in ordered for name in r["strategies"]))
    curves: dict[str, dict[str, list[Any]]] = {}
    bars: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for name in names:
        curve: dict[str, list[Any]] = {"gpus": [], "ettr": [], "ci95": [], "model": []}
        for result in ordered:
            s = result["strategies"].get(name)
            if s is None:
                continue
            if s["ettr"] is None:
                errors.append({"gpus": result["gpus"], "strategy": name, "error": s.get("error", "")})
                continue
            curve["gpus"].append(result["gpus"])
            curve["ettr"].append(s["ettr"])
            # A t interval over a few runs can pass 1; a ratio cannot, so the drawn one stops there.
            ci = s.get("ettr_ci95")
            curve["ci95"].append((max(0.0, ci[0]), min(1.0, ci[1])) if ci else None)
            curve["model"].append(s["ettr_expected"])
            bars.append({"gpus": result["gpus"], "strategy": name, "productive": s["breakdown"]["useful"],
                         "losses": {bucket: s["breakdown"][bucket] for bucket, _ in LOSSES}})
        curves[name] = curve
    bars.sort(key=lambda b: (b["gpus"], names.index(b["strategy"])))  # grouped by size, strategies side by side
    return {"curves": curves, "bars": bars, "errors": errors}


def draw(data: dict[str, Any], target: pathlib.Path) -> None:
    plt = plot.pyplot()
    width = max(13.0, 7.0 + 1.1 * len(data["bars"]))
    figure, (left, right) = plt.subplots(1, 2, figsize=(width, 5.5), gridspec_kw={"width_ratios": [1, 1.3]})
    markers = "os^Dv"
    for i, (name, curve) in enumerate(data["curves"].items()):
        if not curve["gpus"]:
            continue
        lows = [e - ci[0] if ci else 0.0 for e, ci in zip(curve["ettr"], curve["ci95"])]
        highs = [ci[1] - e if ci else 0.0 for e, ci in zip(curve["ettr"], curve["ci95"])]
        line = left.errorbar(curve["gpus"], curve["ettr"], yerr=[lows, highs], marker=markers[i % len(markers)],
                             capsize=4, label=f"{name} (simulated, 95% CI)")
        left.plot(curve["gpus"], curve["model"], linestyle="--", color=line[0].get_color(), alpha=0.6,
                  label=f"{name} (renewal model)")
    gpus = sorted({g for c in data["curves"].values() for g in c["gpus"]})
    if gpus and gpus[-1] >= 10 * gpus[0]:
        left.set_xscale("log")
        left.minorticks_off()
    left.set_xticks(gpus, [f"{g:,}" for g in gpus])
    left.set_xlabel("GPUs")
    left.set_ylabel("ETTR (productive / wall)")
    left.set_title("Effective training time ratio")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8)

    labels = [f"{b['gpus']:,} GPUs\n{b['strategy'].replace('_', ' ')}" for b in data["bars"]]
    bottoms = [0.0] * len(data["bars"])
    for bucket, label in LOSSES:
        heights = [100 * b["losses"][bucket] for b in data["bars"]]
        right.bar(range(len(labels)), heights, bottom=bottoms, label=label, color=plot.BUCKET_COLOURS.get(
            "waiting" if bucket == "waiting_for_spares" else bucket))
        bottoms = [x + h for x, h in zip(bottoms, heights)]
    for x, (top, bar) in enumerate(zip(bottoms, data["bars"])):
        right.annotate(f"productive\n{100 * bar['productive']:.1f}%", (x, top), ha="center", va="bottom", fontsize=8,
                       xytext=(0, 3), textcoords="offset points")
    right.set_xticks(range(len(labels)), labels, fontsize=8)
    right.set_ylabel("% of wall time, not productive")
    right.set_ylim(0, max(bottoms, default=1.0) * 1.25 or 1.0)
    right.set_title("Where the rest of the time goes")
    right.legend(fontsize=8, loc="upper left")
    if data["errors"]:
        figure.text(0.01, -0.04, "did not finish: " + "; ".join(f"{e['strategy']} at {e['gpus']:,} GPUs"
                                                             for e in data["errors"]), fontsize=8)
    plot.save(figure, target)
