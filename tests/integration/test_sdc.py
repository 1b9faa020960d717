"""Silent data corruption end to end, with real processes: supervisor, agents, gloo trainers.

One rank flips one parameter bit after step K. Its digest is outvoted 3 to 1 at step K, its node
is quarantined with the digests as evidence, and the spare takes its rank over from the snapshot
of a step before K (steps from K on are tainted and never committed). The job must end with
exactly the parameters of an uninterrupted run, computed here by the same example trainer
launched without ftsup (`--offline`), so one cluster run suffices.

A gradient bit flipped before the all-reduce reaches every replica alike, so the vote sees
nothing: the scheduled recompute check replays the step on the spare, a third node confirms, and
only then is the culprit quarantined and the job restored from before the step.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest

from ftsup.harness.chaos.reference import ReferenceKey, offline_digest
from ftsup.harness.cluster import ClusterSpec, LocalCluster
from ftsup.harness.demo import trainer_argv
from ftsup.v1 import events_pb2, operator_pb2

pytestmark = pytest.mark.integration

STEPS = 10
FLIP_STEP = 5
FLIP_RANK = 2  # node-3's rank
WORLD = 4


def of_kind(records: list[events_pb2.Record], kind: str) -> list:
    return [getattr(r.event, kind) for r in records if r.event.WhichOneof("kind") == kind]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted run's final digest: the same trainer, four gloo ranks, no agent."""
    return offline_digest(ReferenceKey(steps=STEPS, seed=5, world=WORLD), tmp_path_factory.mktemp("offline"))


def test_a_flipped_parameter_bit_is_caught_the_same_step_and_the_culprit_replaced(tmp_path: pathlib.Path,
                                                                                   reference: str) -> None:
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

        ctl = [sys.executable, "-m", "ftsup.supervisor.ctl.main", "--address", cluster.address, "sdc"]
        view = json.loads(subprocess.run([*ctl, "--json"], capture_output=True, text=True, check=True).stdout)
        assert [(s["node_id"], s["step"], s["vote"]) for s in view["suspects"]] == [("node-3", FLIP_STEP, "minority")]
        assert [(v["action"], v["node_id"]) for v in view["verdicts"]] == [("quarantined", "node-3")]
        text = subprocess.run(ctl, capture_output=True, text=True, check=True).stdout
        assert "node-3 rank 2 (minority)" in text


RECOMPUTE_EVERY = 5  # the check of step 5 replays rank (5 // 5) % 4 = 1, and every rank with it


def test_a_gradient_flip_the_vote_cannot_see_is_caught_by_a_confirmed_recompute(tmp_path: pathlib.Path,
                                                                              reference: str) -> None:
    flip = ("--sdc-flip-step", "5", "--sdc-flip-rank", str(FLIP_RANK), "--sdc-flip-target", "grad",
            "--sdc-flip-bit", "20", "--sdc-flip-tensor", "blocks.0.mlp.0.weight", "--sdc-flip-index", "17")
    spec = ClusterSpec(nodes=4, spares=1, ranks_per_node=1,
                       trainer_argv=trainer_argv(sys.executable, STEPS, seed=5) + flip,
                       heartbeat_interval_s=0.5, reconnect_grace_s=1.0,
                       supervisor_args=("--sdc-recompute-every-steps", str(RECOMPUTE_EVERY),
                                        "--sdc-recompute-timeout-s", "120"))
    started = time.monotonic()
    with LocalCluster(spec, tmp_path / "cluster") as cluster:
        cluster.start()
        status = cluster.wait_for(
            lambda: (s := cluster.status()).phase == operator_pb2.JOB_PHASE_COMPLETED and s, 240, "the job to complete"
        )
        took_s = time.monotonic() - started
        records = cluster.events()
        assert of_kind(records, "sdc_suspected") == []  # every replica averaged the same flipped gradient
        started_checks = of_kind(records, "sdc_check_started")
        finished = {f.check_id: f for f in of_kind(records, "sdc_check_finished")}
        first, second, *later = started_checks
        assert (first.step, first.rank, first.suspect_node_id, first.verifier_node_id, first.generation) == (
            5, 1, "node-2", "spare-1", 1)
        assert [d.rank for d in first.reported] == [0, 1, 2, 3]
        verdict = finished[first.check_id]
        assert verdict.verdict == events_pb2.SDC_VERDICT_MISMATCH and list(verdict.culprit_node_ids) == []
        assert "rank 2 local gradient" in verdict.detail  # the replay names the rank, not the one checked
        assert second.confirms_check_id == first.check_id and second.suspect_node_id == "node-3"
        assert second.verifier_node_id not in ("spare-1", "node-2", "node-3")
        confirmed = finished[second.check_id]
        assert confirmed.verdict == events_pb2.SDC_VERDICT_MISMATCH and list(confirmed.culprit_node_ids) == ["node-3"]
        assert confirmed.HasField("tainted_from_step") and confirmed.tainted_from_step == 5
        by_rank = {d.rank: d for d in confirmed.recomputed}
        reported = {d.rank: d for d in first.reported}
        assert by_rank[2].grad_digest != reported[2].grad_digest
        assert all(by_rank[r].grad_digest == reported[r].grad_digest for r in (0, 1, 3))
        (quarantined,) = of_kind(records, "node_quarantined")
        assert quarantined.node_id == "node-3" and quarantined.reason.startswith("SDC: recompute of step 5")
        evidence = next(r for r in records if r.seq == quarantined.evidence_seq)
        assert evidence.event.WhichOneof("kind") == "sdc_check_finished"
        assert evidence.event.sdc_check_finished.check_id == second.check_id
        # Nothing from step 5 on was committed in generation 1: the restore is the step before.
        assert max(c.step for c in of_kind(records, "snapshot_committed") if c.generation == 1) == 4
        replacement = of_kind(records, "generation_started")[-1]
        assert [m.node_id for m in replacement.members] == ["node-1", "node-2", "spare-1", "node-4"]
        assert replacement.restore_step == 4
        assert all(finished[c.check_id].verdict == events_pb2.SDC_VERDICT_MATCH for c in later)
        assert status.final_digest == reference

        ctl = [sys.executable, "-m", "ftsup.supervisor.ctl.main", "--address", cluster.address, "sdc"]
        view = json.loads(subprocess.run([*ctl, "--json"], capture_output=True, text=True, check=True).stdout)
        assert [(c["check_id"], c["verdict"]) for c in view["checks"][:2]] == [
            (first.check_id, "mismatch"), (second.check_id, "mismatch")]
        assert [r["matches"] for r in view["checks"][0]["ranks"]] == [False, False, False, False]  # params follow
        assert view["checks"][1]["culprit_node_ids"] == ["node-3"]
        assert [(v["action"], v["node_id"]) for v in view["verdicts"]] == [("quarantined", "node-3")]
        text = subprocess.run(ctl, capture_output=True, text=True, check=True).stdout
        assert f"(second opinion on {first.check_id}): mismatch" in text and "convicts node-3" in text
    print(f"recompute e2e: job completed in {took_s:.1f}s")
