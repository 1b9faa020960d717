"""Checkpoints off the step cadence with real processes: `supervisorctl checkpoint now` and the
supervisor's Young/Daly `auto` cadence.

The supervisor, agents and gloo trainers run with a checkpoint store and no step cadence: a
checkpoint exists only because one was requested. The request must travel supervisor ->
directive -> agent -> step-report answer -> every rank, the ranks must agree on the step, save
their shards, and the supervisor must commit it with a manifest naming every rank.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from ftsup.harness.cluster import ClusterSpec, LocalCluster
from ftsup.harness.demo import trainer_argv
from ftsup.v1 import events_pb2, operator_pb2

pytestmark = pytest.mark.integration

STEPS = 40
SLOW = ("--slow-rank", "0", "--slow-ms", "60", "--slow-generation", "1")  # ~60+ ms steps: time to ask


def spec(store: pathlib.Path, *extra: str) -> ClusterSpec:
    return ClusterSpec(
        nodes=2, spares=0, ranks_per_node=2,
        trainer_argv=(*trainer_argv(sys.executable, STEPS, seed=7), *SLOW),
        heartbeat_interval_s=0.5,
        supervisor_args=("--checkpoint-location", str(store), "--checkpoint-lead-s", "0.3", *extra),
    )


def ctl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftsup.supervisor.ctl.main", "--address", address, *args],
                          capture_output=True, text=True, timeout=120)


def of_kind(records: list[events_pb2.Record], kind: str) -> list:
    return [getattr(r.event, kind) for r in records if r.event.WhichOneof("kind") == kind]


def wait_completed(cluster: LocalCluster) -> None:
    cluster.wait_for(lambda: cluster.status().phase == operator_pb2.JOB_PHASE_COMPLETED, 180, "the job to complete")


def manifest_of(store: pathlib.Path, checkpoint_id: str) -> dict:
    return json.loads((store / checkpoint_id / "MANIFEST.json").read_text())


def test_checkpoint_now_is_saved_by_every_rank_at_the_step_it_names(tmp_path: pathlib.Path) -> None:
    store = tmp_path / "checkpoints"
    with LocalCluster(spec(store), tmp_path / "run") as cluster:
        cluster.start()
        cluster.wait_for(lambda: cluster.status().step >= 3, 120, "training to reach step 3")
        done = ctl(cluster.address, "checkpoint", "now", "--reason", "before the driver upgrade",
                   "--operator", "alice", "--wait", "--wait-timeout", "90", "--json")
        assert done.returncode == 0, done.stderr
        reply = json.loads(done.stdout)
        assert reply["outcome"] == "committed", reply
        step, checkpoint_id = reply["step"], reply["checkpoint_id"]
        assert checkpoint_id == f"step-{step:010d}-g1"
        # Once that one committed, the next request is accepted (refusals are unit-tested: a
        # second ctl process cannot reliably catch the first request still outstanding).
        again = ctl(cluster.address, "checkpoint", "now", "--reason", "once more", "--json")
        wait_completed(cluster)
        records = cluster.events()
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["step"] > step
    requested = of_kind(records, "checkpoint_requested")
    assert requested[0].checkpoint_id == checkpoint_id and requested[0].step == step
    assert requested[0].reason == "checkpoint by alice: before the driver upgrade"
    commands = [c for c in of_kind(records, "operator_command") if c.command == "checkpoint"]
    assert commands[0].operator == "alice"
    started = of_kind(records, "checkpoint_started")
    assert started[0].checkpoint_id == checkpoint_id and started[0].shards == 4
    committed = {c.checkpoint_id: c for c in of_kind(records, "checkpoint_committed")}
    assert committed[checkpoint_id].step == step
    manifest = manifest_of(store, checkpoint_id)
    assert manifest["step"] == step and sorted(s["rank"] for s in manifest["shards"]) == [0, 1, 2, 3]
    # No cadence: every checkpoint in the log was requested.
    assert {s.checkpoint_id for s in started} <= {r.checkpoint_id for r in requested}


def test_auto_checkpoints_at_the_young_daly_interval(tmp_path: pathlib.Path) -> None:
    store = tmp_path / "checkpoints"
    # Priors that make the interval short: sqrt(2 * 0.2 s * 3.6 s) = 1.2 s.
    auto = ("--checkpoint-every-steps", "auto", "--checkpoint-prior-cost-s", "0.2",
            "--checkpoint-prior-mtbf-h", "0.001", "--checkpoint-min-interval-s", "1")
    with LocalCluster(spec(store, *auto), tmp_path / "run") as cluster:
        cluster.start()
        cluster.wait_for(lambda: len(of_kind(cluster.events(), "checkpoint_committed")) >= 2, 150,
                         "two auto checkpoints to commit")
        listed = cluster._stub().ListCheckpoints(operator_pb2.ListCheckpointsRequest(), timeout=10)
        wait_completed(cluster)
        records = cluster.events()
    requested = of_kind(records, "checkpoint_requested")
    assert len(requested) >= 2 and all(r.reason.startswith("auto: ") for r in requested)
    assert "Young" in requested[0].reason or "sqrt" in requested[0].reason
    committed = of_kind(records, "checkpoint_committed")
    # The newest three are kept (--checkpoint-keep's default) and carry their step; older ones were
    # deleted by retention (a slow machine fits more intervals into the job than an idle one).
    kept, deleted = committed[-3:], committed[:-3]
    for c in kept:
        assert manifest_of(store, c.checkpoint_id)["step"] == c.step
    assert not any((store / c.checkpoint_id).exists() for c in deleted), "retention keeps three"
    assert "auto" in listed.cadence and listed.interval_reason.startswith("used (auto)")
    assert listed.HasField("interval_s") and listed.interval_s >= 1.0
