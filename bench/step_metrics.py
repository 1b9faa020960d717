"""The leader's metrics per training step: folded as arrays, against one observation per rank.

Every step of N nodes x 8 ranks reaches the leader as N `StepAggregate`s, and the runtime hands
each to `SupervisorMetrics.on_input` (supervisor/metrics.py): the step and compute time
histograms and each rank's latest figures (tokens/s, the per-rank series). The baseline, in the
same run on the same aggregates, is that work done as it was before (kept here): two
`Histogram.observe` calls and a `_RankLatest` object per rank. Both must expose the same
histogram counts and tokens/s (checked: `same_figures`). CPU time (time.process_time), medians
of `--steps` steps.

    ftsup bench step-metrics --json                  # 1,250 and 12,500 nodes x 8 ranks
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Histogram

from ftsup.bench.arguments import int_list
from ftsup.supervisor.core.inputs import DigestRanks, StepAggregate
from ftsup.supervisor.metrics import STEP_BUCKETS, SupervisorMetrics

STEP_S = (2.0, 10.0)


@dataclass(slots=True)
class _RankLatest:
    step: int
    step_time_s: float
    compute_time_s: float
    tokens: int


class _PerValueMetrics:
    """The step figures as SupervisorMetrics kept them before arrays: the baseline."""

    def __init__(self) -> None:
        registry = CollectorRegistry()
        self.step_seconds = Histogram("step_seconds", "", buckets=STEP_BUCKETS, registry=registry)
        self.compute_seconds = Histogram("compute_seconds", "", buckets=STEP_BUCKETS, registry=registry)
        self.ranks: dict[int, _RankLatest] = {}

    def on_aggregate(self, inp: StepAggregate) -> None:
        step_times, compute_times = inp.step_time_s.tolist(), inp.compute_time_s.tolist()
        for value in step_times:
            self.step_seconds.observe(value)
        for value in compute_times:
            self.compute_seconds.observe(value)
        for rank, step_s, compute_s, tokens in zip(inp.ranks.tolist(), step_times, compute_times, inp.tokens.tolist()):
            latest = self.ranks.get(rank)
            if latest is None or inp.step >= latest.step:
                self.ranks[rank] = _RankLatest(inp.step, step_s, compute_s, tokens)

    def tokens_per_s(self) -> float:
        rates = [r.tokens / r.step_time_s for r in self.ranks.values() if r.tokens and r.step_time_s > 0]
        return sum(rates) if rates else math.nan


def _step(nodes: int, ranks_per_node: int, step: int, rng: random.Random) -> list[StepAggregate]:
    out = []
    for node in range(nodes):
        ranks = np.arange(node * ranks_per_node, (node + 1) * ranks_per_node, dtype=np.int64)
        compute = np.array([0.9 * rng.lognormvariate(0.0, 0.02) for _ in ranks])
        ones = np.ones(len(ranks))
        out.append(StepAggregate(f"node-{node:05d}", 1, step, ranks, ones, compute, ones * 2.0, ones,
                                 np.full(len(ranks), 4096, dtype=np.int64),
                                 (DigestRanks("d", np.arange(len(ranks))),), (), np.full(len(ranks), -1)))
    return out


def run_size(nodes: int, ranks_per_node: int, steps: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    ours, baseline = SupervisorMetrics(), _PerValueMetrics()
    cpu: dict[str, list[float]] = {"arrays": [], "per_value": []}
    for step in range(1, steps + 1):
        aggregates = _step(nodes, ranks_per_node, step, rng)
        started = time.process_time()
        for aggregate in aggregates:
            ours.on_input(aggregate, None)
        ours.flush()  # (what a scrape or the batch bound does: counted with the step)
        cpu["arrays"].append(time.process_time() - started)
        started = time.process_time()
        for aggregate in aggregates:
            baseline.on_aggregate(aggregate)
        cpu["per_value"].append(time.process_time() - started)
    ranks = nodes * ranks_per_node
    same = (math.isclose(ours.tokens_per_s(), baseline.tokens_per_s(), rel_tol=1e-9)
            and _count(ours.step_seconds.collect()) == _count(baseline.step_seconds.collect())
            and _count(ours.compute_seconds.collect()) == _count(baseline.compute_seconds.collect()))
    result: dict[str, Any] = {"nodes": nodes, "ranks": ranks, "steps": steps, "same_figures": bool(same)}
    for name, spent in cpu.items():
        median = statistics.median(spent)
        result[name] = {"median_cpu_s_per_step": round(median, 5), "us_per_node": round(median / nodes * 1e6, 2),
                        "core_fraction_at_step_s": {f"{s:g}": round(median / s, 4) for s in STEP_S}}
    result["speedup"] = round(result["per_value"]["median_cpu_s_per_step"]
                              / max(result["arrays"]["median_cpu_s_per_step"], 1e-9), 1)
    return result


def _count(families: Any) -> float:
    """A histogram's observation count, from its exposition."""
    return float(next(s.value for family in families for s in family.samples if s.name.endswith("_count")))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup bench step-metrics", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int_list(1, 100_000), default="1250,12500", help="comma-separated node counts")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 1 <= args.ranks_per_node <= 64 or args.steps < 1:
        parser().error("--ranks-per-node within [1, 64], --steps >= 1")
    runs = [run_size(n, args.ranks_per_node, args.steps, args.seed) for n in args.nodes]
    print(json.dumps({"bench": "step_metrics", "runs": runs,
                      "baseline": "per_value: Histogram.observe per value and an object per rank (the old way),"
                                  " same run"}))
    return 0 if all(r["same_figures"] for r in runs) else 1
