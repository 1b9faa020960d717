"""Snapshot holdings on the leader's core: one step's holdings as SnapshotReports one by one
against one SnapshotHoldings per node and holder, in one run.

The pure core (`Core.step` and `Core.advance`, as the runtime drives it, no transport) of a
generation of `--nodes` x `--ranks-per-node`: every node reports the step (one StepAggregate
each, so its vote clears first, as in a real job), then its own ranks' holdings, then every
buddy its copies; the last holding commits the step. Timed: the holdings' inputs from the first to
the commit. The baseline is the same step reported one SnapshotReport per rank and holder (what
every agent sent before issue 14, and what an agent still sends an older supervisor). `folds`:
the same SnapshotHoldings decided as the leader's runtime decides a link shard's runs of them
(up to RUN_MAX back to back, several nodes' holdings of one step as one: Core.step_holdings).
Times are this process's CPU (time.process_time), not the wall clock, so a busy machine inflates
them less. No gRPC: `ftsup bench scale --snapshot-reports` measures the transport's share end to
end.

    ftsup bench holdings --json                 # 12,500 nodes x 8 ranks
    ftsup bench holdings --nodes 1000 --json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, cast

from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.events import NodeRole, SnapshotCommitted
from ftsup.supervisor.core.inputs import (
    AgentHello,
    Input,
    SnapshotHoldings,
    SnapshotReport,
    StepAggregate,
    StepReport,
    Tick,
)
from ftsup.supervisor.core.step import Core
from ftsup.supervisor.server.relay_service import RUN_MAX

NOW = 1_000.0


def _core(nodes: int, ranks_per_node: int) -> Core:
    config = CoreConfig(job=JobSpec(name="bench", nodes=nodes, ranks_per_node=ranks_per_node, argv=("train",)),
                        detector=DetectorConfig(heartbeat_interval_s=5.0, heartbeat_misses=3, reconnect_grace_s=5.0),
                        spare_grace_s=0.0)
    core = Core(config)
    hellos = [(AgentHello(f"n{i:05d}", 1, NodeRole.ACTIVE, "10.0.0.1", 7071, 8, i + 1), NOW) for i in range(nodes)]
    for start in range(0, nodes, 512):
        _apply(core, core.step_hellos(hellos[start:start + 512]).ready)
    _apply(core, core.step(Tick(), NOW + 0.1))
    return core


def _apply(core: Core, ready: Any) -> None:
    core.advance(ready, core.records(ready.events, NOW))


def _step(core: Core, inp: Input) -> list[Any]:
    ready = core.step(inp, NOW + 1.0)
    if ready.refusal is not None:
        raise RuntimeError(f"refused {type(inp).__name__}: {ready.refusal.reason}")
    _apply(core, ready)
    return list(ready.events)


def _fold(core: Core, parts: list[SnapshotHoldings]) -> list[Any]:
    """One run's holdings decided as the runtime does (Core.step_holdings; the rest alone)."""
    stepped = core.step_holdings(parts, NOW + 1.0)
    if stepped is None:
        return [e for part in parts for e in _step(core, part)]
    if any(refusal is not None for refusal in stepped.refusals):
        raise RuntimeError("a part of the holdings was refused")
    _apply(core, stepped.ready)
    return [*stepped.ready.events, *(e for part in parts[len(stepped.refusals):] for e in _step(core, part))]


def run(nodes: int, ranks_per_node: int, *, folded: bool, runs: bool = False) -> dict[str, Any]:
    core = _core(nodes, ranks_per_node)
    generation = core.state.generation
    assert generation is not None
    for member in generation.members:
        _step(core, StepAggregate.of_reports(tuple(
            StepReport(member.node_id, generation.number, r, 1, 1.0, 0.5, 2.0, "d") for r in member.ranks)))
    messages: list[Input] = []
    for role in ("owner", "buddy"):
        for member in generation.members:
            holder = member.node_id if role == "owner" else member.buddy_node_id
            held = tuple(SnapshotReport(holder, generation.number, r, 1, (holder,), 1 << 30, f"{r:064x}")
                         for r in member.ranks)
            messages += [SnapshotHoldings.of_reports(held)] if folded else list(held)
    committed = 0
    start = time.process_time()
    if runs:
        for begin in range(0, len(messages), RUN_MAX):
            parts = cast(list[SnapshotHoldings], messages[begin:begin + RUN_MAX])
            committed += sum(isinstance(e, SnapshotCommitted) for e in _fold(core, parts))
    else:
        for message in messages:
            committed += sum(isinstance(e, SnapshotCommitted) for e in _step(core, message))
    elapsed_s = time.process_time() - start
    return {"inputs": len(messages), "committed": committed, "core_s": round(elapsed_s, 6),
            "per_input_us": round(elapsed_s / len(messages) * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ftsup bench holdings", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    p.add_argument("--nodes", type=int, default=12_500)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="holdings only, no baseline")
    args = p.parse_args(argv)
    holdings = run(args.nodes, args.ranks_per_node, folded=True)
    folds = run(args.nodes, args.ranks_per_node, folded=True, runs=True)
    baseline = None if args.quick else run(args.nodes, args.ranks_per_node, folded=False)
    print(json.dumps({"nodes": args.nodes, "ranks_per_node": args.ranks_per_node,
                      "what": "core CPU of one step's snapshot holdings, first input to the commit",
                      "holdings": holdings, "folds": folds, "baseline": baseline,
                      "speedup_folds_vs_holdings": round(holdings["core_s"] / max(folds["core_s"], 1e-9), 2)}))
    return 0
