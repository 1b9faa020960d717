"""`ftsup sim`: flags in, the closed-form numbers and each strategy's simulated ETTR out.

Human text by default, one JSON object with `--json` (a sweep puts one object per GPU count in a
list under "sweep"). Bad flags exit 2 with a message naming the value; a job that cannot finish
under a strategy is reported for that strategy (ettr null, "error") rather than hanging.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from ftsup.common import plot
from ftsup.harness.sim import plot as sim_plot
from ftsup.harness.sim.engine import BUCKETS, NoProgress, RunResult, simulate
from ftsup.harness.sim.fleet import Fleet, build_fleet
from ftsup.harness.sim.model import (
    DEFAULT_COMPONENTS,
    HOUR_S,
    STRATEGIES,
    YOUNG_DALY_FORMULA,
    SimSpec,
    analytic,
    parse_component,
)
from ftsup.harness.sim.stats import estimate
from ftsup.harness.stop_signals import default_stop_actions

DEFAULT_GPUS = 1024


def _parser() -> argparse.ArgumentParser:
    defaults = SimSpec(gpus=DEFAULT_GPUS)
    parts = " ".join(f"{c.name}:{c.mttf_h:g}:{c.count}" for c in DEFAULT_COMPONENTS)
    p = argparse.ArgumentParser(
        prog="ftsup sim",
        description="Discrete-event fleet simulator: drives the supervisor's pure core (decide/evolve) with"
        " simulated nodes in virtual time and reports the effective training time ratio (ETTR) of"
        " checkpoint-only recovery at the Young/Daly interval and of ftsup's recovery ladder.",
    )
    a = p.add_argument
    a("--gpus", type=int, default=DEFAULT_GPUS, help=f"GPUs in the job (default {DEFAULT_GPUS})")
    a("--gpus-per-node", type=int, default=defaults.gpus_per_node, help="default %(default)s")
    a("--component", action="append", default=None, metavar="NAME:MTTF_HOURS:COUNT_PER_NODE",
      help=f"one kind of part in every node; repeat for each kind (replaces the defaults: {parts})")
    a("--job-days", type=float, default=defaults.job_days, help="days of useful training (default %(default)s)")
    a("--step-s", type=float, default=defaults.step_s, help="seconds per training step (default %(default)s)")
    a("--checkpoint-s", type=float, default=defaults.checkpoint_s,
      help="training pause per object-store checkpoint, both strategies (default %(default)s)")
    a("--checkpoint-interval-h", type=float, default=None,
      help="checkpoint_only: work between checkpoints (default: the Young/Daly interval)")
    a("--detect-s", type=float, default=defaults.detect_s,
      help="checkpoint_only: failure to detection (default %(default)s)")
    a("--restart-s", type=float, default=defaults.restart_s,
      help="restart all and load the checkpoint: checkpoint_only, and ftsup's fallback (default %(default)s)")
    a("--heartbeat-s", type=float, default=defaults.heartbeat_s, help="ftsup: heartbeat interval (default %(default)s)")
    a("--heartbeat-misses", type=int, default=defaults.heartbeat_misses,
      help="ftsup: silent intervals before a node is dead (default %(default)s)")
    a("--snapshot-s", type=float, default=defaults.snapshot_s, help="ftsup: pause per RAM snapshot (default %(default)s)")
    a("--snapshot-every", type=int, default=defaults.snapshot_every_steps,
      help="ftsup: steps between RAM snapshots (default %(default)s)")
    a("--warm-restart-s", type=float, default=defaults.warm_restart_s,
      help="ftsup: re-form on a warm spare and restore from RAM (default %(default)s)")
    a("--ftsup-checkpoint-h", type=float, default=defaults.ftsup_checkpoint_h,
      help="ftsup: object-store checkpoint interval, the fallback (default %(default)s)")
    a("--spares", type=int, default=None, help="spare nodes (default: enough that the pool runs dry < 0.1%% of the time)")
    a("--repair-h", type=float, default=defaults.repair_h,
      help="a failed node rejoins as a spare this long after it died (default %(default)s)")
    a("--strategy", choices=("both", *STRATEGIES), default="both")
    a("--runs", type=int, default=None,
      help="replications per strategy (default: 10 up to 1,000 nodes, 3 up to 5,000, else 1)")
    a("--seed", type=int, default=0)
    a("--jobs", type=int, default=None,
      help="processes running replications side by side; results do not depend on it"
      " (default: 1 below 5,000 nodes, else one per CPU, at most one per replication)")
    a("--sweep", default=None, metavar="GPUS,GPUS,...", help="simulate each GPU count (e.g. 1000,10000,100000)")
    a("--json", action="store_true", help="print one JSON object")
    a("--plot", default=None, metavar="FILE.png",
      help="also draw ETTR against GPUs with 95%% intervals and where the time goes (needs ftsup[plot])")
    return p


def spec_from(args: argparse.Namespace, gpus: int) -> SimSpec:
    components = tuple(parse_component(c) for c in args.component) if args.component else DEFAULT_COMPONENTS
    return SimSpec(
        gpus=gpus, gpus_per_node=args.gpus_per_node, components=components, job_days=args.job_days,
        step_s=args.step_s, checkpoint_s=args.checkpoint_s, checkpoint_interval_h=args.checkpoint_interval_h,
        detect_s=args.detect_s, restart_s=args.restart_s, heartbeat_s=args.heartbeat_s,
        heartbeat_misses=args.heartbeat_misses, snapshot_s=args.snapshot_s,
        snapshot_every_steps=args.snapshot_every, warm_restart_s=args.warm_restart_s,
        ftsup_checkpoint_h=args.ftsup_checkpoint_h, spares=args.spares, repair_h=args.repair_h,
    )


def default_runs(nodes: int) -> int:
    return 10 if nodes <= 1000 else 3 if nodes <= 5000 else 1


def _sweep(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--sweep {text!r} is not a comma-separated list of GPU counts") from None
    if not values:
        raise ValueError(f"--sweep {text!r} names no GPU count")
    return values


@dataclass(frozen=True, slots=True)
class StrategyReport:
    name: str
    results: tuple[RunResult, ...]
    error: str = ""


def strategy_json(spec: SimSpec, report: StrategyReport) -> dict[str, Any]:
    model = analytic(spec, report.name)
    out: dict[str, Any] = {"ettr_expected": model.ettr_expected, "ettr_first_order": model.ettr_first_order}
    if report.error:
        return {"ettr": None, "error": report.error, **out}
    runs = report.results
    ettr = estimate([r.ettr for r in runs])
    wall = sum(r.wall_s for r in runs)
    seconds = {b: sum(dict(r.seconds)[b] for r in runs) for b in BUCKETS}
    return {
        "ettr": ettr.mean,
        "ettr_ci95": list(ettr.ci95) if ettr.ci95 else None,
        "ettr_stdev": ettr.stdev,
        **out,
        "is_expected_within_ci": ettr.contains(model.ettr_expected) if ettr.ci95 else None,
        "runs": len(runs),
        "wall_h": wall / len(runs) / HOUR_S,
        "failures": sum(r.failures for r in runs) / len(runs),
        "breakdown": {b: seconds[b] / wall for b in BUCKETS},  # fractions of wall time, summing to 1
        "hours": {b: seconds[b] / len(runs) / HOUR_S for b in BUCKETS},
        "restores_from_ram": sum(r.restores_from_ram for r in runs) / len(runs),
        "restores_from_checkpoint": sum(r.restores_from_checkpoint for r in runs) / len(runs),
        "waits_for_spares": sum(r.waits_for_spares for r in runs) / len(runs),
    }


@contextlib.contextmanager
def _rare_collections() -> Iterator[None]:
    """A run allocates millions of short-lived objects, freed by reference counting as they go;
    the cyclic collector's frequent passes cost ~7 % of a 100k-GPU run. Collect rarely while
    simulating, as before after."""
    threshold = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


@dataclass(frozen=True, slots=True)
class _Task:
    """One replication: a strategy on a fleet with a seed."""

    spec: SimSpec
    strategy: str
    run: int
    seed: int


@dataclass(frozen=True, slots=True)
class _Done:
    result: RunResult | None
    error: str  # NoProgress's message, when the run could not finish
    cpu_s: float


_FLEETS: dict[tuple[int, int, int], Fleet] = {}  # built once per process and fleet shape


def _fleet_for(spec: SimSpec) -> Fleet:
    key = (spec.nodes, spec.spare_count, spec.gpus_per_node)
    if key not in _FLEETS:
        _FLEETS[key] = build_fleet(*key)
    return _FLEETS[key]


def _run_task(task: _Task) -> _Done:
    started = time.process_time()
    try:
        result = simulate(task.spec, task.strategy, _fleet_for(task.spec), task.seed)
        return _Done(result, "", time.process_time() - started)
    except NoProgress as exc:
        return _Done(None, str(exc), time.process_time() - started)


def default_jobs(specs: list[SimSpec], tasks: int) -> int:
    """One process below 5,000 nodes (a run takes seconds), else one per CPU this process may use."""
    if max(s.nodes for s in specs) < 5000:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, tasks))


def _run_all(tasks: list[_Task], jobs: int) -> list[_Done]:
    """Every replication, in `tasks` order. Replications are independent (each has its own seed
    and its own core state), so `jobs` processes may run them side by side: the same results."""
    if jobs <= 1 or len(tasks) <= 1:
        return [_run_task(t) for t in tasks]
    context: multiprocessing.context.BaseContext
    try:
        context = multiprocessing.get_context("fork")  # workers inherit the fleets built here
    except ValueError:
        context = multiprocessing.get_context()
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i].spec.nodes)  # the longest first
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=context,
                             initializer=default_stop_actions) as pool:
        futures = {i: pool.submit(_run_task, tasks[i]) for i in order}
        try:
            return [futures[i].result() for i in range(len(tasks))]
        except BaseException:
            # Stopped (Ctrl-C, SIGTERM) or a replication failed: the rest is not wanted. The pool's
            # exit alone would run every queued replication first (minutes at fleet scale).
            workers = list((pool._processes or {}).values())  # shutdown() forgets them
            pool.shutdown(wait=False, cancel_futures=True)
            for worker in workers:
                worker.terminate()
            for worker in workers:  # ended, not just told to: nothing of the run outlives it
                worker.join(timeout=10.0)
                if worker.is_alive():
                    worker.kill()
            raise


def simulate_fleets(specs: list[SimSpec], strategies: tuple[str, ...], runs: list[int], seed: int,
                    jobs: int | None = None) -> list[dict[str, Any]]:
    """Everything `--json` prints, one object per GPU count (`runs`: replications of each)."""
    tasks = [_Task(spec, name, i, seed * 1_000_003 + i) for spec, n in zip(specs, runs) for name in strategies
             for i in range(n)]
    jobs = default_jobs(specs, len(tasks)) if jobs is None else jobs
    with _rare_collections():
        build_s = []
        for spec in specs:
            started = time.process_time()
            _fleet_for(spec)
            build_s.append(time.process_time() - started)
        try:
            done = _run_all(tasks, jobs)
        finally:
            _FLEETS.clear()
    results = []
    for spec, built_s in zip(specs, build_s):
        mine = [(t, d) for t, d in zip(tasks, done) if t.spec is spec]
        reports: dict[str, Any] = {}
        for name in strategies:
            runs_of = [d for t, d in mine if t.strategy == name]
            error = next((d.error for d in runs_of if d.error), "")  # the first run that could not finish
            finished = () if error else tuple(d.result for d in runs_of if d.result is not None)
            reports[name] = strategy_json(spec, StrategyReport(name, finished, error))
        results.append(_fleet_json(spec, seed, reports, built_s + sum(d.cpu_s for _, d in mine), jobs))
    return results


def _fleet_json(spec: SimSpec, seed: int, reports: dict[str, Any], cpu_s: float, jobs: int) -> dict[str, Any]:
    return {
        "gpus": spec.gpus,
        "gpus_per_node": spec.gpus_per_node,
        "nodes": spec.nodes,
        "spares": spec.spare_count,
        "components": [{"name": c.name, "mttf_h": c.mttf_h, "count_per_node": c.count} for c in spec.components],
        "node_mtbf_h": spec.node_mtbf_h,
        "fleet_mtbf_h": spec.fleet_mtbf_h,
        "job_hours": spec.job_hours,
        "expected_failures": spec.expected_failures,
        "young_daly_interval_h": spec.young_daly_interval_h,
        "young_daly_formula": YOUNG_DALY_FORMULA,
        "daly_higher_order_interval_h": spec.daly_higher_order_interval_h,
        "checkpoint_interval_h": spec.checkpoint_interval_s / HOUR_S,
        "seed": seed,
        "strategies": reports,
        "cpu_s": cpu_s,  # every process's CPU time for this GPU count (see "jobs")
        "jobs": jobs,
    }


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def render(result: dict[str, Any]) -> str:
    parts = ", ".join(f"{c['name']} {c['mttf_h']:,.0f} h x{c['count_per_node']}" for c in result["components"])
    lines = [
        f"{result['gpus']:,} GPUs = {result['nodes']:,} nodes x {result['gpus_per_node']}, {result['spares']} spares,"
        f" {result['job_hours']:,.0f} h of training",
        f"  node MTBF          {result['node_mtbf_h']:,.1f} h   ({parts})",
        f"  fleet MTBF         {result['fleet_mtbf_h']:,.3f} h" + (
            f"  ({result['fleet_mtbf_h'] * 60:,.1f} min)" if result["fleet_mtbf_h"] < 2 else ""),
        f"  expected failures  {result['expected_failures']:,.1f} in {result['job_hours']:,.0f} h of training",
        f"  Young/Daly         {result['young_daly_interval_h']:,.3f} h  = {result['young_daly_formula']};"
        f" Daly higher order {result['daly_higher_order_interval_h']:,.3f} h",
        "",
        f"  {'strategy':<16} {'ETTR':>6} {'95% CI':>17} {'model':>6} {'1st-ord':>7} {'fails':>7}"
        f" | {'ckpt':>6} {'snap':>6} {'detect':>6} {'spares':>6} {'restart':>7} {'lost':>6}",
    ]
    for name, s in result["strategies"].items():
        if s["ettr"] is None:
            lines.append(f"  {name:<16} {'-':>6}  {s['error']}")
            continue
        ci = f"[{s['ettr_ci95'][0]:.4f}, {s['ettr_ci95'][1]:.4f}]" if s["ettr_ci95"] else "(1 run)"
        b = s["breakdown"]
        lines.append(
            f"  {name:<16} {s['ettr']:.4f} {ci:>17} {s['ettr_expected']:.4f} {s['ettr_first_order']:7.4f}"
            f" {s['failures']:7.1f} | {_pct(b['checkpoint_pauses'])} {_pct(b['snapshot_pauses'])}"
            f" {_pct(b['detection'])} {_pct(b['waiting_for_spares'])} {_pct(b['restart']):>7} {_pct(b['lost_work'])}"
        )
    runs = {s.get("runs") for s in result["strategies"].values() if s.get("runs")}
    lines.append(f"  (breakdown: share of wall time; model: renewal expectation for exponential failures;"
                 f" runs {', '.join(map(str, sorted(runs))) or '-'}, seed {result['seed']}, {result['cpu_s']:.1f} s CPU"
                 f" in {result['jobs']} process{'es' if result['jobs'] > 1 else ''})")
    return "\n".join(lines)


def render_sweep(results: list[dict[str, Any]]) -> str:
    head = (f"{'GPUs':>8} {'fleet MTBF':>11} {'failures':>9} {'Y/D h':>7} {'strategy':<16} {'ETTR':>6}"
            f" {'95% CI':>17} {'model':>6} {'lost+restart+detect':>19}")
    lines = [head, "-" * len(head)]
    for r in results:
        for name, s in r["strategies"].items():
            if s["ettr"] is None:
                lines.append(f"{r['gpus']:>8,} {r['fleet_mtbf_h']:>9.3f} h {r['expected_failures']:>9.1f}"
                             f" {r['young_daly_interval_h']:>7.3f} {name:<16} {'-':>6} {s['error']}")
                continue
            ci = f"[{s['ettr_ci95'][0]:.4f}, {s['ettr_ci95'][1]:.4f}]" if s["ettr_ci95"] else "(1 run)"
            b = s["breakdown"]
            lines.append(
                f"{r['gpus']:>8,} {r['fleet_mtbf_h']:>9.3f} h {r['expected_failures']:>9.1f}"
                f" {r['young_daly_interval_h']:>7.3f} {name:<16} {s['ettr']:.4f} {ci:>17} {s['ettr_expected']:.4f}"
                f" {_pct(b['lost_work'] + b['restart'] + b['detection']):>19}"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    strategies = STRATEGIES if args.strategy == "both" else (args.strategy,)
    try:
        gpu_counts = _sweep(args.sweep) if args.sweep is not None else [args.gpus]
        specs = [spec_from(args, gpus) for gpus in gpu_counts]  # every flag checked before any work
        if args.runs is not None and not 1 <= args.runs <= 10_000:
            raise ValueError(f"--runs must be within [1, 10000], got {args.runs}")
        if args.jobs is not None and not 1 <= args.jobs <= 256:
            raise ValueError(f"--jobs must be within [1, 256], got {args.jobs}")
        target = plot.check_target(args.plot) if args.plot else None
        if target is not None:
            plot.pyplot()  # a missing matplotlib is said now, not after the simulation
    except (ValueError, plot.PlotUnavailable) as exc:
        print(f"ftsup sim: error: {exc}", file=sys.stderr)
        return 2
    runs = [args.runs or default_runs(s.nodes) for s in specs]
    results = simulate_fleets(specs, strategies, runs, args.seed, args.jobs)
    if args.json:
        print(json.dumps({"sweep": results} if args.sweep is not None else results[0], indent=2))
    else:
        print(render_sweep(results) if args.sweep is not None else render(results[0]))
    if target is not None:
        sim_plot.draw(sim_plot.plot_data(results), target)
        print(f"ftsup sim: wrote {target}", file=sys.stderr)
    return 0
