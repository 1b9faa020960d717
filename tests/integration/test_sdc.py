"""Silent data corruption end to end, with real processes: supervisor, agents, gloo trainers.

One rank flips one parameter bit after step K. Its digest is outvoted 3 to 1 at step K, its node
is quarantined with the digests as evidence, and the spare takes its rank over from the snapshot
of a step before K (steps from K on are tainted and never committed). The job must end with
exactly the parameters of an uninterrupted run, computed here by the same example trainer
launched without ftsup (`--offline`), so one cluster run suffices.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from ftsup.v1 import events_pb2, operator_pb2
from harness.chaos.reference import ReferenceKey, offline_digest
from harness.cluster import ClusterSpec, LocalCluster
from harness.demo import trainer_argv

pytestmark = pytest.mark.integration

STEPS = 10
FLIP_STEP = 5
FLIP_RANK = 2  # node-3's rank
WORLD = 4


def of_kind(records: list[events_pb2.Record], kind: str) -> list:
    return [getattr(r.event, kind) for r in records if r.event.WhichOneof("kind") == kind]


def offline_reference(tmp_path: pathlib.Path) -> str:
    """The uninterrupted run's final digest: the same trainer, four gloo ranks, no agent."""
    return offline_digest(ReferenceKey(steps=STEPS, seed=5, world=WORLD), tmp_path / "offline")


def test_a_flipped_parameter_bit_is_caught_the_same_step_and_the_culprit_replaced(tmp_path: pathlib.Path) -> None:
    reference = offline_reference(tmp_path)
    flip = ("--sdc-flip-step", str(FLIP_STEP), "--sdc-flip-rank", str(FLIP_RANK), "--sdc-flip-bit", "30",
            "--sdc-flip-tensor", "blocks.0.mlp.0.weight", "--sdc-flip-index", "17")
    spec = ClusterSpec(nodes=4, spares=1, ranks_per_node=1,
                       trainer_argv=trainer_argv(sys.executable, STEPS, seed=5) + flip,
                       heartbeat_interval_s=0.5, reconnect_grace_s=1.0)
    with LocalCluster(spec, tmp_path / "cluster") as cluster:
        cluster.start()
        status = cluster.wait_for(
            lambda: (s := cluster.status()).phase == operator_pb2.JOB_PHASE_COMPLETED and s, 240, "the job to complete"
        )
        records = cluster.events()
        suspects = of_kind(records, "sdc_suspected")
        assert [(s.node_id, s.rank, s.step, s.generation, s.group_size) for s in suspects] == [
            ("node-3", FLIP_RANK, FLIP_STEP, 1, WORLD)
        ]
        assert suspects[0].digest != suspects[0].majority_digest != ""
        ended = of_kind(records, "generation_ended")[0]
        assert ended.reason == events_pb2.END_REASON_NODE_QUARANTINED and ended.node_id == "node-3"
        (quarantined,) = of_kind(records, "node_quarantined")
        assert quarantined.node_id == "node-3" and quarantined.reason.startswith("SDC:")
        evidence = next(r for r in records if r.seq == quarantined.evidence_seq)
        assert evidence.event.WhichOneof("kind") == "sdc_suspected"
        # Nothing from the divergent step on was committed in generation 1; the restore precedes it.
        first = [c.step for c in of_kind(records, "snapshot_committed") if c.generation == 1]
        assert first and max(first) < FLIP_STEP
        replacement = of_kind(records, "generation_started")[-1]
        assert [m.node_id for m in replacement.members] == ["node-1", "node-2", "spare-1", "node-4"]
        assert replacement.HasField("restore_step") and replacement.restore_step == max(first)
        assert status.final_digest == reference

        ctl = [sys.executable, "-m", "supervisor.ctl.main", "--address", cluster.address, "sdc"]
        view = json.loads(subprocess.run([*ctl, "--json"], capture_output=True, text=True, check=True).stdout)
        assert [(s["node_id"], s["step"], s["vote"]) for s in view["suspects"]] == [("node-3", FLIP_STEP, "minority")]
        assert [(v["action"], v["node_id"]) for v in view["verdicts"]] == [("quarantined", "node-3")]
        text = subprocess.run(ctl, capture_output=True, text=True, check=True).stdout
        assert "node-3 rank 2 (minority)" in text
