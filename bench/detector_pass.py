"""The leader's failure detector per Tick: the memo's skipped passes against a pass over every node.

The leader judges its fleet on every Tick, ten a second (`policies/failure.judge`). A pass over
12,500 nodes costs milliseconds, so ten a second is a share of a core that grows with the fleet,
not with what happens in it. The memo (supervisor/core/detector_memo.py) walks the fleet only
when the oldest heartbeat's deadline can have come, or after anything else the detector reads
changed. This bench runs both on the same virtual fleet in the same run: N connected nodes
heartbeating at `--interval-s` (spread evenly, heard through one HeardFrom summary per Tick,
as link shards report them), one node silenced part-way (it must be suspected and declared
dead at the same Ticks both ways, checked: `same_verdicts`), Ticks every 0.1 s of virtual time
for `--seconds`. Only the detector's calls are timed (time.process_time).

Reported per size: CPU per Tick and the fraction of a core at ten Ticks a second, with the
memo and for the baseline (an empty memo on every Tick: the pass the leader made before), the
passes the memo made, and the speed-up.

    ftsup bench detector-pass --json                       # 1,250 and 12,500 nodes, 5 s and 1 s
    ftsup bench detector-pass --nodes 12500 --interval-s 5 --json
"""

from __future__ import annotations

import argparse
import json
import time
from types import MappingProxyType
from typing import Any

from ftsup.bench.arguments import int_list
from ftsup.supervisor.core import frozen
from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core.config import DetectorConfig
from ftsup.supervisor.core.events import NodeRole
from ftsup.supervisor.core.inputs import AgentHello, HeardFrom
from ftsup.supervisor.core.policies import failure
from ftsup.supervisor.core.state import ClusterState, Liveness, NodeRecord, SoftState

TICK_S = 0.1  # the runtime's Tick period


def run_one(nodes: int, interval_s: float, seconds: float) -> dict[str, Any]:
    config = DetectorConfig(heartbeat_interval_s=interval_s)
    ids = [f"n{i:05d}" for i in range(nodes)]
    state = ClusterState(nodes=MappingProxyType({n: NodeRecord(n, 1, NodeRole.ACTIVE, "h", 9000, 8) for n in ids}))
    soft = SoftState(started_at_s=0.0)
    for stream, node_id in enumerate(ids, 1):
        soft_state.observe(soft, state, AgentHello(node_id, 1, NodeRole.ACTIVE, "h", 9000, 8, stream), 0.0)
    ticks_per_interval = max(1, round(interval_s / TICK_S))
    phases = [ids[k::ticks_per_interval] for k in range(ticks_per_interval)]  # who heartbeats in which Tick
    silent, silent_from = ids[nodes // 2], seconds / 3
    memo_s = base_s = 0.0
    memo_verdicts: list[tuple[float, str, str]] = []
    base_verdicts: list[tuple[float, str, str]] = []
    ticks = round(seconds / TICK_S)
    for tick in range(1, ticks + 1):
        now = tick * TICK_S
        heard = tuple(n for n in phases[tick % ticks_per_interval] if not (n == silent and now >= silent_from))
        soft_state.observe(soft, state, HeardFrom(heard), now)
        started = time.process_time()
        verdicts = failure.judge(state, soft, config, now)
        memo_s += time.process_time() - started
        empty = SoftState(started_at_s=soft.started_at_s, nodes=soft.nodes, shard_heard_s=soft.shard_heard_s)
        started = time.process_time()
        baseline = failure.judge(state, empty, config, now)
        base_s += time.process_time() - started
        memo_verdicts += [(round(now, 1), v.node_id, v.liveness.value) for v in verdicts]
        base_verdicts += [(round(now, 1), v.node_id, v.liveness.value) for v in baseline]
        for verdict in verdicts:  # (folded as the core's events would be)
            changed = frozen.replace(state.nodes[verdict.node_id], liveness=verdict.liveness)
            state = frozen.replace(state, nodes=MappingProxyType({**state.nodes, verdict.node_id: changed}))
    memo = soft.detector_memo
    per_tick = memo_s / ticks
    base_per_tick = base_s / ticks
    return {
        "nodes": nodes, "interval_s": interval_s, "ticks": ticks, "passes": memo.passes,
        "us_per_tick": round(per_tick * 1e6, 1), "core_fraction": round(per_tick / TICK_S, 5),
        "baseline_us_per_tick": round(base_per_tick * 1e6, 1),
        "baseline_core_fraction": round(base_per_tick / TICK_S, 5),
        "speedup": round(base_per_tick / per_tick, 1) if per_tick else None,
        "verdicts": [list(v) for v in memo_verdicts],
        "same_verdicts": memo_verdicts == base_verdicts,
        "silenced": {"node": silent, "at_s": round(silent_from, 1)},
        "dead_as_expected": any(v[1] == silent and v[2] == Liveness.DEAD.value for v in memo_verdicts),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup bench detector-pass", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int_list(2, 100_000), default="1250,12500", help="comma-separated fleet sizes")
    p.add_argument("--interval-s", default="5,1", help="comma-separated heartbeat intervals")
    p.add_argument("--seconds", type=float, default=30.0, help="virtual seconds of Ticks per run")
    p.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        intervals = [float(part) for part in args.interval_s.split(",") if part.strip()]
    except ValueError as exc:
        parser().error(f"--interval-s: {exc}")
    if not intervals or any(not 0.1 <= i <= 60 for i in intervals) or not 1 <= args.seconds <= 3600:
        parser().error("--interval-s within [0.1, 60]; --seconds within [1, 3600]")
    runs = [run_one(n, i, args.seconds) for n in args.nodes for i in intervals]
    print(json.dumps({"bench": "detector_pass", "tick_s": TICK_S,
                      "baseline": "the same Ticks judged with an empty memo (a pass over every node), same run",
                      "runs": runs}))
    return 0 if all(r["same_verdicts"] and r["dead_as_expected"] for r in runs) else 1
