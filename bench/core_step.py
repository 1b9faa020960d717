"""The leader core's CPU per training step: one StepAggregate per node against one StepReport per rank.

One step of N nodes x 8 ranks, from the wire messages the leader receives (`agent_pb2.StepAggregate`,
one per node, as agents and link shards send them) through `step_aggregate.to_input` and
`Core.step` (admission, soft state, the straggler detector and the SDC vote once the step is
whole, decide; records folded when a step decides anything). No gRPC, no event log: this is the
core's share of a step, the part issue 14 made array-based. The baseline, measured in the same
run on an identical core, is the same step sent as one `agent_pb2.StepReport` per rank (what an
agent that does not aggregate sends: `report_from_proto` and `Core.step` per rank); the steps of
the two alternate, so both see the same machine load. Both cores must decide the same (checked:
`same_decisions`). Also measured on cores of their own: `folded` (the per-node messages as a link
shard's runs bring them, decided in folds), `packed` (the same step as the shards' packed
ShardStepFolds: one message per up to 4,096 nodes, decoded once into its arrays and decided
whole, Core.step_fold) and `packed_parts` (the same folds decoded into their parts and decided by
Core.step_aggregates: the leader's path before issue 14, part 15).

Reported per size: CPU per step (time.process_time; every step's and the median over `--steps`,
after one warm-up step that starts the generation running), CPU per rank, and the fraction of a
core the leader spends on steps at a 2 s and a 10 s training step.

    ftsup bench core-step --json                       # 1,250 and 12,500 nodes x 8 ranks
    ftsup bench core-step --nodes 1250 --steps 9 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ftsup.common import step_fold_pack, step_pack
from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.events import NodeRole
from ftsup.supervisor.core.inputs import AgentHello, Input, StepAggregate, Tick
from ftsup.supervisor.core.state import ClusterState, SoftState
from ftsup.supervisor.core.step import Core
from ftsup.supervisor.server import step_fold
from ftsup.supervisor.server.relay_service import RUN_MAX
from ftsup.supervisor.server.step_aggregate import report_from_proto, to_input
from ftsup.supervisor.shard_queue import MAX_PACKED
from ftsup.v1 import agent_pb2

STEP_S = (2.0, 10.0)  # training step lengths the projection is made for


def _core(nodes: int, ranks_per_node: int) -> Core:
    """A core whose generation of `nodes` x `ranks_per_node` has started (not yet running)."""
    config = CoreConfig(job=JobSpec(name="bench", nodes=nodes, ranks_per_node=ranks_per_node, argv=("train",)),
                        detector=DetectorConfig(heartbeat_interval_s=5.0, heartbeat_misses=3, reconnect_grace_s=1.0),
                        spare_grace_s=0.0)
    core = Core(config, ClusterState(), SoftState(started_at_s=0.0))
    hellos = [(AgentHello(f"node-{i:05d}", 1, NodeRole.ACTIVE, f"10.0.{i // 250}.{i % 250}", 29500, ranks_per_node,
                          stream_id=i + 1, failure_domain=f"rack-{i // 32}"), 1.0) for i in range(nodes)]
    ready = core.step_hellos(hellos).ready
    core.advance(ready, core.records(ready.events, 1.0))
    ready = core.step(Tick(), 1.0)
    core.advance(ready, core.records(ready.events, 1.0))
    if core.state.generation is None:
        raise RuntimeError(f"no generation started: {core.waiting_reason}")
    return core


def _wire_step(core: Core, step: int, rng: random.Random) -> list[tuple[str, list[agent_pb2.StepReport]]]:
    """Each node's ranks' reports of `step`: ~1 s compute with 2 % jitter, one digest for all."""
    generation = core.state.generation
    assert generation is not None
    out = []
    for member in generation.members:
        reports = []
        for rank in member.ranks:
            compute = 0.9 * rng.lognormvariate(0.0, 0.02)
            reports.append(agent_pb2.StepReport(
                generation=generation.number, rank=rank, step=step, step_time_s=1.0, compute_time_s=compute,
                loss=2.0 - step * 1e-3, param_digest=f"{step:032x}", grad_norm=1.0, tokens=4096))
        out.append((member.node_id, reports))
    return out


def _feed(core: Core, inputs: list[Input], now: float) -> int:
    """Steps every input (folding what it decides); returns the events decided."""
    events = 0
    for inp in inputs:
        ready = core.step(inp, now)
        if ready.refusal is not None:
            raise RuntimeError(f"refused: {ready.refusal.reason}")
        if ready.events:
            events += len(ready.events)
            core.advance(ready, core.records(ready.events, now))
    return events


def _aggregated(core: Core, wire: list[tuple[str, list[agent_pb2.StepReport]]], now: float) -> tuple[float, int]:
    messages = [(node, step_pack.pack(reports)) for node, reports in wire]  # what arrives (agent-side work)
    started = time.process_time()
    events = _feed(core, [to_input(node, message) for node, message in messages], now)
    return time.process_time() - started, events


def _folded(core: Core, wire: list[tuple[str, list[agent_pb2.StepReport]]], now: float) -> tuple[float, int]:
    """The aggregates as a link shard's batches bring them to the leader's loop: runs of up to
    RUN_MAX, each run's back-to-back aggregates of one step decided as one fold
    (Core.step_aggregates; what runtime._handle_run does)."""
    messages = [(node, step_pack.pack(reports)) for node, reports in wire]
    started = time.process_time()
    parts = [to_input(node, message) for node, message in messages]
    events = sum(_decide_fold(core, parts[start:start + RUN_MAX], now) for start in range(0, len(parts), RUN_MAX))
    return time.process_time() - started, events


def _decide_fold(core: Core, parts: Sequence[StepAggregate], now: float, folded: StepAggregate | None = None) -> int:
    """One fold decided as the runtime decides it (parts one by one when the core declines);
    returns the events it appended. Every part must be admitted: the bench's steps are valid."""
    stepped = core.step_aggregates(parts, now, folded) if len(parts) > 1 else None
    if stepped is None:
        return _feed(core, list(parts), now)
    if len(stepped.refusals) < len(parts) or any(refusal is not None for refusal in stepped.refusals):
        raise RuntimeError("a part of the step was refused")
    if stepped.ready.events:
        core.advance(stepped.ready, core.records(stepped.ready.events, now))
    return len(stepped.ready.events)


def _packed(core: Core, wire: list[tuple[str, list[agent_pb2.StepReport]]], now: float) -> tuple[float, int]:
    """The aggregates as link shards pack them (ShardStepFold: up to MAX_PACKED nodes' aggregates of
    one step in one message, common/step_fold_pack.py; the packing is the shards' work, not timed):
    each fold decoded once into its arrays (step_fold.to_fold) and decided whole (Core.step_fold;
    what the relay and runtime._handle_step_fold do), its parts made only if it is declined."""
    return _timed_folds(core, _packed_folds(wire), now, _decide_packed)


def _packed_parts(core: Core, wire: list[tuple[str, list[agent_pb2.StepReport]]], now: float) -> tuple[float, int]:
    """The same packed folds decoded into their fold and its parts (step_fold.to_fold, .parts()) and
    decided by Core.step_aggregates: the leader's path before part 15 (the baseline of `packed`)."""
    return _timed_folds(core, _packed_folds(wire), now, _decide_parts)


def _packed_folds(wire: list[tuple[str, list[agent_pb2.StepReport]]]) -> list[tuple[list[str], Any]]:
    messages = [(node, step_pack.pack(reports)) for node, reports in wire]
    folds = []
    for start in range(0, len(messages), MAX_PACKED):
        chunk = messages[start:start + MAX_PACKED]
        folds.append(([node for node, _ in chunk],
                      step_fold_pack.pack([(i, message) for i, (_, message) in enumerate(chunk, start=1)])))
    return folds


def _timed_folds(core: Core, folds: list[tuple[list[str], Any]], now: float,
                 decide: Callable[[Core, list[str], Any, float], int]) -> tuple[float, int]:
    started = time.process_time()
    events = sum(decide(core, node_ids, fold, now) for node_ids, fold in folds)
    return time.process_time() - started, events


def _decide_packed(core: Core, node_ids: list[str], message: Any, now: float) -> int:
    folded = step_fold.to_fold(node_ids, message)
    stepped = core.step_fold(folded, now) if len(node_ids) > 1 else None
    if stepped is None:
        return _decide_fold(core, folded.parts(), now, folded)
    if stepped.ready.events:
        core.advance(stepped.ready, core.records(stepped.ready.events, now))
    return len(stepped.ready.events)


def _decide_parts(core: Core, node_ids: list[str], message: Any, now: float) -> int:
    folded = step_fold.to_fold(node_ids, message)
    return _decide_fold(core, folded.parts(), now, folded)


def _per_rank(core: Core, wire: list[tuple[str, list[agent_pb2.StepReport]]], now: float) -> tuple[float, int]:
    started = time.process_time()
    events = _feed(core, [report_from_proto(node, r) for node, reports in wire for r in reports], now)
    return time.process_time() - started, events


def _summary(cpu_s: list[float], ranks: int) -> dict[str, Any]:
    median = statistics.median(cpu_s)
    return {
        "cpu_s_per_step": [round(t, 4) for t in cpu_s],
        "median_cpu_s_per_step": round(median, 4),
        "median_cpu_us_per_rank": round(median / ranks * 1e6, 3),
        "core_fraction_at_step_s": {f"{s:g}": round(median / s, 4) for s in STEP_S},
    }


MODES = {"packed": _packed, "packed_parts": _packed_parts, "folded": _folded, "aggregated": _aggregated,
         "per_rank": _per_rank}


def run_size(nodes: int, ranks_per_node: int, steps: int, seed: int, baseline: bool) -> dict[str, Any]:
    cores = {"packed": _core(nodes, ranks_per_node), "packed_parts": _core(nodes, ranks_per_node),
             "folded": _core(nodes, ranks_per_node), "aggregated": _core(nodes, ranks_per_node)}
    if baseline:
        cores["per_rank"] = _core(nodes, ranks_per_node)
    cpu: dict[str, list[float]] = {name: [] for name in cores}
    events: dict[str, int] = dict.fromkeys(cores, 0)
    rng = random.Random(seed)
    now = 2.0
    for step in range(1, steps + 2):  # step 1 is the warm-up (the generation starts running)
        wire = _wire_step(cores["aggregated"], step, rng)
        now += 1.0
        for name, core in cores.items():
            spent, decided = MODES[name](core, wire, now)
            events[name] += decided
            if step > 1:
                cpu[name].append(spent)
    ranks = nodes * ranks_per_node
    result: dict[str, Any] = {"nodes": nodes, "ranks_per_node": ranks_per_node, "ranks": ranks,
                              "steps_measured": steps, "events_decided": events}
    result.update({name: _summary(cpu[name], ranks) for name in cores})
    result["same_decisions"] = all(_same(cores["aggregated"], core) for core in cores.values())
    result["speedup_folded_vs_aggregated"] = _ratio(result, "aggregated", "folded")
    result["speedup_packed_vs_folded"] = _ratio(result, "folded", "packed")
    result["speedup_packed_vs_packed_parts"] = _ratio(result, "packed_parts", "packed")
    if baseline:
        result["speedup"] = _ratio(result, "per_rank", "aggregated")
        result["speedup_folded_vs_per_rank"] = _ratio(result, "per_rank", "folded")
    return result


def _same(one: Core, other: Core) -> bool:
    """Both cores decided the same: state, and the detectors' soft state."""
    a, b = one.soft.progress, other.soft.progress
    return one.state == other.state and (a is None) == (b is None) and (a is None or b is None or (
        a.straggler == b.straggler and a.sdc_clear_steps == b.sdc_clear_steps and a.step_reports == b.step_reports))


def _ratio(result: dict[str, Any], slower: str, faster: str) -> float:
    return round(result[slower]["median_cpu_s_per_step"] / max(result[faster]["median_cpu_s_per_step"], 1e-9), 2)


def fold_sizes(nodes: int, ranks_per_node: int, sizes: Sequence[int], steps: int, seed: int) -> dict[str, Any]:
    """The packed path at each fold size (nodes' aggregates per ShardStepFold, as a link shard's
    batches happen to carry them), each size on a core of its own, steps alternating between the
    sizes so that all see the same machine: the leader's CPU per node-step against a fold's size."""
    cores = {size: _core(nodes, ranks_per_node) for size in sizes}
    cpu: dict[int, list[float]] = {size: [] for size in sizes}
    rng = random.Random(seed)
    now = 2.0
    for step in range(1, steps + 2):  # step 1 is the warm-up
        wire = _wire_step(cores[sizes[0]], step, rng)
        messages = [(node, step_pack.pack(reports)) for node, reports in wire]
        now += 1.0
        for size, core in cores.items():
            folds = [([node for node, _ in messages[start:start + size]],
                      step_fold_pack.pack([(i, m) for i, (_, m) in enumerate(messages[start:start + size], start=1)]))
                     for start in range(0, len(messages), size)]
            started = time.process_time()
            for node_ids, fold in folds:
                _decide_packed(core, node_ids, fold, now)
            if step > 1:
                cpu[size].append(time.process_time() - started)
    first = cores[sizes[0]]
    return {"nodes": nodes, "ranks_per_node": ranks_per_node, "steps_measured": steps,
            "same_decisions": all(_same(first, core) for core in cores.values()),
            "by_fold_size": {str(size): {"median_cpu_s_per_step": round(statistics.median(cpu[size]), 4),
                                         "median_cpu_us_per_node": round(statistics.median(cpu[size]) / nodes * 1e6, 1)}
                             for size in sizes}}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup bench core-step", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="1250,12500", help="comma-separated node counts")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--steps", type=int, default=5, help="steps measured per size (the median is over them)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-baseline", action="store_true", help="skip the per-rank baseline")
    p.add_argument("--fold-sizes", default="", metavar="N,N,...",
                   help="instead: the packed path at each fold size (aggregates per ShardStepFold), e.g. 8,50,4096")
    p.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        sizes = [int(n) for n in args.nodes.split(",") if n]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or args.ranks_per_node < 1 or args.steps < 1:
        print("ftsup bench core-step: --nodes (comma-separated), --ranks-per-node and --steps must be positive",
              file=sys.stderr)
        return 2
    try:
        folds = [int(n) for n in args.fold_sizes.split(",") if n]
    except ValueError:
        folds = [0]
    if folds and min(folds) < 1:
        print("ftsup bench core-step: --fold-sizes must be positive integers, comma-separated", file=sys.stderr)
        return 2
    runs = []
    if folds:
        for nodes in sizes:
            print(f"core-step: {nodes} nodes x {args.ranks_per_node} ranks, folds of {folds} ...", file=sys.stderr)
            runs.append(fold_sizes(nodes, args.ranks_per_node, folds, args.steps, args.seed))
        print(json.dumps({"bench": "core_step_fold_sizes", "runs": runs,
                          "load_average": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count()}))
        return 0
    for nodes in sizes:
        print(f"core-step: {nodes} nodes x {args.ranks_per_node} ranks ...", file=sys.stderr)
        runs.append(run_size(nodes, args.ranks_per_node, args.steps, args.seed, not args.no_baseline))
    print(json.dumps({"bench": "core_step", "runs": runs, "baseline": "per_rank (one StepReport per rank, same run)",
                      "load_average": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
