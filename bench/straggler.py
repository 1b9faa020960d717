"""Straggler detector on synthetic traces: recall, detection delay and false quarantines vs a naive baseline.

Traces: `ranks` x `steps` per-rank compute times with lognormal jitter, a per-step cohort-wide
factor, small fixed per-rank offsets (no two GPUs are identical), whole-cohort stalls (a data
loader hiccup adds the same seconds to every rank), single-rank GC pauses and short single-rank
bursts (2-5 steps of 10-50 % extra). Slowed traces multiply one rank's compute time by
1 + slowdown from a random step on. The detector under test is the pure policy
`supervisor.core.policies.straggler`; the baseline, run on the same traces, flags a rank whenever
its compute time exceeds the step's mean + 3 standard deviations (no robust statistics, no
persistence). A "false quarantine" is a flag on a rank that was not slowed (or before it was).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict

import numpy as np

from ftsup.supervisor.core.policies.straggler import StragglerConfig, StragglerState, observe_step

SLOWDOWNS = (0.05, 0.10, 0.20, 0.50)


def make_trace(rng: np.random.Generator, ranks: int, steps: int) -> np.ndarray:
    """Returns a steps x ranks array of compute times in seconds (about 1 s per step)."""
    base = 1.0 + rng.normal(0.0, 0.005, size=ranks)  # fixed per-rank offsets
    cohort = rng.lognormal(0.0, 0.02, size=(steps, 1))  # whole-step variation shared by all ranks
    jitter = rng.lognormal(0.0, 0.03, size=(steps, ranks))
    times = base * cohort * jitter
    stalls = rng.random(steps) < 0.003  # data-loader stalls hit every rank alike
    times[stalls] += rng.uniform(0.5, 3.0, size=(int(stalls.sum()), 1))
    gc = rng.random((steps, ranks)) < 0.002  # a GC pause on one rank for one step
    times[gc] += rng.uniform(0.05, 0.4, size=int(gc.sum()))
    for _ in range(rng.poisson(0.0005 * steps * ranks)):  # short single-rank bursts
        rank, start = int(rng.integers(ranks)), int(rng.integers(steps))
        length = int(rng.integers(2, 6))
        times[start:start + length, rank] *= 1.0 + rng.uniform(0.1, 0.5)
    return times


def run_detector(times: np.ndarray, config: StragglerConfig) -> list[tuple[int, int]]:
    """Returns (step, rank) of every flag verdict of the pure detector over the trace."""
    state = StragglerState()
    flags: list[tuple[int, int]] = []
    ranks = np.arange(times.shape[1], dtype=np.int64)
    for step in range(times.shape[0]):
        verdicts = observe_step(state, step, ranks, np.ascontiguousarray(times[step], dtype=np.float64), config)
        flags.extend((v.step, v.rank) for v in verdicts if v.is_straggler)
    return flags


def run_baseline(times: np.ndarray) -> list[tuple[int, int]]:
    """Naive mean + 3 sigma per step, no persistence: a flag whenever a rank crosses it (rising edge)."""
    over = times > times.mean(axis=1, keepdims=True) + 3.0 * times.std(axis=1, keepdims=True)
    rising = over & ~np.vstack([np.zeros((1, times.shape[1]), dtype=bool), over[:-1]])
    steps, ranks = np.nonzero(rising)
    return list(zip(steps.tolist(), ranks.tolist()))


def score(flags: list[tuple[int, int]], slowed_rank: int | None, start: int | None) -> tuple[int | None, int]:
    """Returns (detection delay in slowed steps or None, false flags) for one trace."""
    delay = None
    false_flags = 0
    for step, rank in flags:
        if slowed_rank is not None and rank == slowed_rank and start is not None and step >= start:
            if delay is None:
                delay = step - start + 1
        else:
            false_flags += 1
    return delay, false_flags


def _summary(delays: dict[float, list[int | None]], horizon: int) -> dict[str, Mapping[str, float | None]]:
    recall: dict[str, float] = {}
    within: dict[str, float] = {}
    median: dict[str, float | None] = {}  # None: no trace of that slowdown was caught
    for slowdown, found in delays.items():
        key = f"{slowdown:.2f}"
        hits = [d for d in found if d is not None]
        recall[key] = len(hits) / len(found)
        within[key] = sum(1 for d in hits if d <= horizon) / len(found)
        median[key] = statistics.median(hits) if hits else None
    return {"recall": recall, "within": within, "delay": median}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench straggler", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=20, help="slowed traces per slowdown")
    parser.add_argument("--clean", type=int, default=10, help="clean traces (one seed each)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="16 ranks x 600 steps, 2 trials: a smoke run")
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the output is always JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.ranks, args.steps, args.trials, args.clean = 16, 600, 2, 2
    if args.ranks < 8 or args.steps < 200 or args.trials < 1 or args.clean < 1:
        parser.error("need --ranks >= 8, --steps >= 200, --trials >= 1, --clean >= 1")
    config = StragglerConfig()
    horizon = 20
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)

    clean_false = {"detector": 0, "baseline": 0}
    for _ in range(args.clean):
        times = make_trace(rng, args.ranks, args.steps)
        clean_false["detector"] += score(run_detector(times, config), None, None)[1]
        clean_false["baseline"] += score(run_baseline(times), None, None)[1]

    delays: dict[str, dict[float, list[int | None]]] = {"detector": {}, "baseline": {}}
    slowed_false = {"detector": 0, "baseline": 0}
    for slowdown in SLOWDOWNS:
        for name in delays:
            delays[name][slowdown] = []
        for _ in range(args.trials):
            times = make_trace(rng, args.ranks, args.steps)
            rank = int(rng.integers(args.ranks))
            start = int(rng.integers(args.steps // 10, args.steps - args.steps // 10))
            times[start:, rank] *= 1.0 + slowdown
            for name, flags in (("detector", run_detector(times, config)), ("baseline", run_baseline(times))):
                delay, false_flags = score(flags, rank, start)
                delays[name][slowdown].append(delay)
                slowed_false[name] += false_flags

    ours, naive = _summary(delays["detector"], horizon), _summary(delays["baseline"], horizon)
    result = {
        "bench": "straggler",
        "ranks": args.ranks,
        "steps": args.steps,
        "clean_traces": args.clean,
        "slowed_traces_per_slowdown": args.trials,
        "seed": args.seed,
        "config": asdict(config),
        "recall_by_slowdown": ours["recall"],
        f"recall_within_{horizon}_steps_by_slowdown": ours["within"],
        "delay_steps_by_slowdown": ours["delay"],
        "false_quarantines": clean_false["detector"],
        "false_quarantines_in_slowed_traces": slowed_false["detector"],
        "baseline": {
            "name": "per-step mean + 3 sigma of compute time, no persistence",
            "recall_by_slowdown": naive["recall"],
            f"recall_within_{horizon}_steps_by_slowdown": naive["within"],
            "delay_steps_by_slowdown": naive["delay"],
            "false_quarantines": clean_false["baseline"],
            "false_quarantines_in_slowed_traces": slowed_false["baseline"],
        },
        "goal": {"false_quarantines": 0, "delay_steps_at_20pct_max": horizon},
        "goal_met": clean_false["detector"] == 0
        and ours["delay"]["0.20"] is not None
        and ours["delay"]["0.20"] <= horizon
        and ours["recall"]["0.20"] == 1.0,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
