"""The leader core's CPU to count one checkpoint's shards: one report per rank, up to 100,000 ranks.

Every rank of a checkpoint reports its written shard; the core checks it (`checkpoints.on_shard_report`:
in flight, in range, not yet counted) and folds a `CheckpointShardWritten` into the state
(`evolve`). Followers fold the same records, and a restarted replica replays them. With the
written ranks as tuples (each fold copied the tuple, each check scanned it) this was quadratic
in the ranks; `PendingCheckpoint.written` is now a GrowOnly (supervisor/core/grow_only.py).

The baseline, in the same run: the same reports folded the tuple way (a copy of the old evolve
step for this one event, kept here), at sizes up to `--baseline-max` (quadratic: 100,000 ranks
take minutes), with the projection to the largest size from its largest measured one (x n^2).

    ftsup bench checkpoint-fold --json                        # 1,000 / 10,000 / 100,000 ranks
    ftsup bench checkpoint-fold --ranks 20000 --json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ftsup.bench.arguments import int_list
from ftsup.supervisor.core import checkpoints, frozen
from ftsup.supervisor.core.events import CheckpointShardWritten, CheckpointStarted
from ftsup.supervisor.core.evolve import evolve
from ftsup.supervisor.core.inputs import CheckpointShardReport
from ftsup.supervisor.core.state import ClusterState, Generation, PendingCheckpoint, ShardRecord

CHECKPOINT_ID = "step-0000000100-g1"


def _started(ranks: int) -> ClusterState:
    generation = Generation(1, (), ranks, "127.0.0.1", 29500, None, 0, (), first_step=1)
    state = ClusterState(generation=generation)
    return evolve(state, CheckpointStarted(CHECKPOINT_ID, 1, 100, ranks, "s3://bench/ckpt"))


def _reports(ranks: int) -> list[CheckpointShardReport]:
    return [CheckpointShardReport(f"n{rank // 8}", 1, rank, CHECKPOINT_ID, 100, f"{CHECKPOINT_ID}/shards/rank-{rank:05d}",
                                  "a" * 64, 1 << 20) for rank in range(ranks)]


def fold(ranks: int) -> tuple[float, ClusterState]:
    """The core's own path: check each report, fold its event. Returns (CPU seconds, final state)."""
    state, reports = _started(ranks), _reports(ranks)
    started = time.process_time()
    for report in reports:
        for event in checkpoints.on_shard_report(state, report):
            state = evolve(state, event)
    return time.process_time() - started, state


def _tuple_evolve(pending: PendingCheckpoint, event: CheckpointShardWritten) -> PendingCheckpoint:
    """The fold as it was with tuples: scan for the rank, copy both tuples."""
    written: Any = pending.written
    if event.shard in written:  # (a scan of the tuple)
        raise ValueError(f"shard {event.shard} already written")
    record = ShardRecord(event.shard, event.key, event.sha256, event.size_bytes)
    records: Any = pending.records
    return frozen.replace(pending, written=(*written, event.shard), records=(*records, record))


def fold_tuples(ranks: int) -> tuple[float, int]:
    """The baseline: the same checks and folds over tuples. Returns (CPU seconds, shards counted)."""
    state, reports = _started(ranks), _reports(ranks)
    pending = state.pending_checkpoint
    assert pending is not None
    empty: Any = ()
    pending = frozen.replace(pending, written=empty, records=empty)
    started = time.process_time()
    for report in reports:
        if report.rank in pending.written:  # (on_shard_report's check, a scan)
            continue
        event = CheckpointShardWritten(CHECKPOINT_ID, report.rank, report.key, report.sha256, report.size_bytes)
        pending = _tuple_evolve(pending, event)
    return time.process_time() - started, len(pending.written)


def run(sizes: list[int], baseline_max: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    largest_baseline: tuple[int, float] | None = None
    for ranks in sizes:
        cpu_s, state = fold(ranks)
        pending = state.pending_checkpoint
        assert pending is not None and pending.is_complete, "every shard must be counted"
        row: dict[str, Any] = {"ranks": ranks, "cpu_s": round(cpu_s, 4), "us_per_shard": round(cpu_s / ranks * 1e6, 2)}
        if ranks <= baseline_max:
            base_s, counted = fold_tuples(ranks)
            assert counted == ranks
            row.update(baseline_tuples_cpu_s=round(base_s, 4), speedup=round(base_s / cpu_s, 1) if cpu_s else None)
            largest_baseline = (ranks, base_s)
        elif largest_baseline is not None:
            measured_ranks, measured_s = largest_baseline
            row["baseline_tuples_projected_s"] = round(measured_s * (ranks / measured_ranks) ** 2, 1)
        rows.append(row)
    return {"bench": "checkpoint_fold", "baseline": "the same folds over tuples (the old evolve), same run",
            "sizes": rows}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup bench checkpoint-fold", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int_list(1, 10_000_000), default="1000,10000,100000",
                   help="comma-separated checkpoint sizes (ranks)")
    p.add_argument("--baseline-max", type=int, default=20_000,
                   help="largest size the quadratic tuple baseline runs at (larger sizes are projected)")
    p.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    print(json.dumps(run(args.ranks, args.baseline_max)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
