"""Elastic shrink and grow with real processes: an elastic job (2 nodes x 2 ranks, min_nodes 1)
with no spare loses a node, runs on 1 node with 2 micro-batches per rank (same global batch),
and grows back to 2 nodes once a node joins, the new ranks restoring other ranks' RAM copies.

The loss curve must follow the uninterrupted run's: rank 0 prints the loss of the data it trained
on, so every step trained in a full world — before the shrink and, what matters, after the grow,
whose parameters went through the shrunk steps' updates — must print a loss within 1e-3 of the
reference's. Not bitwise: accumulation adds the micro-batch gradients in another order than the
full world's all-gather does. (A shrunk step's print is the mean over its two micro-batches, a
different quantity.)
"""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

from ftsup.harness.chaos.reference import ReferenceKey, offline_digest
from ftsup.harness.cluster import ClusterSpec, LocalCluster
from ftsup.harness.demo import trainer_argv
from ftsup.v1 import events_pb2, operator_pb2

pytestmark = pytest.mark.integration

STEPS = 40
SEED = 11
TOLERANCE = 1e-3


def losses(text: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in re.findall(r"^step (\d+) loss ([0-9.]+)", text, re.MULTILINE)}


def of_kind(records: list[events_pb2.Record], kind: str) -> list:
    return [getattr(r.event, kind) for r in records if r.event.WhichOneof("kind") == kind]


def test_a_lost_node_shrinks_the_job_and_a_returning_node_grows_it_back(tmp_path: pathlib.Path) -> None:
    offline_digest(ReferenceKey(STEPS, SEED, 4), tmp_path / "reference")
    reference = losses((tmp_path / "reference" / "offline-rank-0.log").read_text(errors="replace"))
    assert sorted(reference) == list(range(1, STEPS + 1))

    spec = ClusterSpec(
        nodes=2, spares=0, ranks_per_node=2, min_nodes=1,
        # Rank 0 slowed by 150 ms in every generation: time for the node to return before the end.
        trainer_argv=(*trainer_argv(sys.executable, STEPS, SEED), "--slow-rank", "0", "--slow-ms", "150",
                      "--slow-generation", "0"),
        heartbeat_interval_s=0.5, warm_trainers=2,
    )
    with LocalCluster(spec, tmp_path / "run") as cluster:
        cluster.start()
        cluster.wait_for(lambda: cluster.trainer_step("node-1") >= 4, 120, "training to reach step 4")
        cluster.kill_node("node-2")
        shrunk = cluster.wait_for(
            lambda: next((g for g in of_kind(cluster.events(), "generation_started") if g.world_size == 2), None),
            60, "a generation shrunk to 2 ranks")
        cluster.wait_for(lambda: cluster.trainer_step("node-1", generation=shrunk.generation) > 0, 120,
                         "the shrunk generation to step")
        cluster.start_agent("node-3", "active")
        cluster.wait_for(lambda: cluster.status().phase == operator_pb2.JOB_PHASE_COMPLETED, 240,
                         "the job to complete")
        records = cluster.events()
        logs = {p.name: p.read_text(errors="replace") for p in (tmp_path / "run" / "nodes" / "node-1").glob("rank-0.gen-*.log")}

    started = of_kind(records, "generation_started")
    ended = of_kind(records, "generation_ended")
    assert [g.world_size for g in started][:3] == [4, 2, 4], [(g.generation, g.world_size) for g in started]
    assert "shrunk to 1 of 2 nodes" in started[1].reason
    assert ended[1].reason == events_pb2.END_REASON_ELASTIC_GROW, ended
    grown = started[2]
    borrowed = [r for r in grown.restores if r.HasField("source_rank")]
    assert {r.rank for r in borrowed} == {2, 3} and {r.source_rank for r in borrowed} <= {0, 1}
    assert {m.node_id for m in grown.members} == {"node-1", "node-3"}
    assert grown.restore_step >= 1

    # Rank 0 ran on node-1 in every generation; the last generation to print a step kept it.
    kept: dict[int, tuple[int, float]] = {}
    for name in sorted(logs, key=lambda n: int(re.search(r"gen-(\d+)", n).group(1))):
        generation = int(re.search(r"gen-(\d+)", name).group(1))
        kept.update({step: (generation, loss) for step, loss in losses(logs[name]).items()})
    assert sorted(kept) == list(range(1, STEPS + 1))
    shrunk_steps = [s for s, (g, _) in kept.items() if g == shrunk.generation]
    assert shrunk_steps, "the shrunk generation trained no step that was kept"
    after = [s for s, (g, _) in kept.items() if g > shrunk.generation]
    assert len(after) >= 10 and min(after) > max(shrunk_steps)
    full = {s: loss for s, (g, loss) in kept.items() if g != shrunk.generation}
    off = {s: (loss, reference[s]) for s, loss in full.items() if abs(loss - reference[s]) > TOLERANCE}
    assert not off, off
