"""`ftsup bench scale` at smoke size on real processes: a supervisor, two load processes, 200 nodes.

Asserts the JSON a user reads has its keys, the whole fleet connected and trained, every
heartbeat that asked for an ack (one in ten: real agents ask none) was acknowledged, and the node silenced with its stream open was declared dead (and
no other node was); with three replicas, that a SIGKILLed shard's nodes are heard again elsewhere
with no verdict, and with snapshot holdings (owner and buddy copies) that steps commit and the
nodes hear of it in SnapshotRetain notices. No latency or CPU thresholds: this machine is shared.
"""

from __future__ import annotations

import json

import pytest

from ftsup.harness import cli

pytestmark = pytest.mark.integration

RUN_KEYS = {
    "nodes", "heartbeat_interval_s", "nodes_connected", "nodes_training", "connect_s", "latency_p50_ms",
    "latency_p99_ms", "supervisor_cpu_fraction", "supervisor_rss_mb", "load_cpu_fraction", "suspect_s",
    "detect_s", "false_verdicts", "heartbeats_sent", "heartbeats_asked_ack", "heartbeats_acked", "goal_met",
    "steady_window_s", "leader_cpu_fraction_steady",
}


def test_scale_bench_at_smoke_size_measures_latency_and_detects_the_silent_node(capsys):
    assert cli.main(["bench", "scale", "--json", "--nodes", "200", "--intervals", "1", "--duration-s", "6",
                     "--step-s", "2", "--sweep", "", "--probe-nodes", "10"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"latency_definition", "detect_definition", "goal", "baseline", "runs"} <= set(result)
    run = result["runs"]["1"]
    assert "error" not in run, run.get("error")
    assert set(run) >= RUN_KEYS
    assert run["nodes_connected"] == run["nodes_training"] == 200
    assert result["ack_every"] == 10
    assert run["heartbeats_sent"] > 200 and run["heartbeats_acked"] >= 0.95 * run["heartbeats_asked_ack"]
    assert 0 < run["heartbeats_asked_ack"] < 0.5 * run["heartbeats_sent"], "one in ten asks, not every one"
    assert run["step_reports_per_s"] > 0
    assert run["probe_nodes"] == 10 and run["probe_latency_samples"] >= 10, "the probe's nodes ack every heartbeat"
    assert 0 < run["probe_latency_p50_ms"] <= run["probe_latency_p99_ms"]
    assert 0 < run["latency_p50_ms"] <= run["latency_p99_ms"]
    assert run["supervisor_cpu_fraction"] > 0 and run["supervisor_rss_mb"] > 0
    # The silent node: suspected, then declared dead, not before its silence could be seen.
    assert run["detect_s"] is not None and run["suspect_s"] is not None
    assert 1.0 <= run["suspect_s"] <= run["detect_s"]
    assert run["detect_s"] >= run["detect_limit_s"] - 0.2
    assert run["false_verdicts"] == 0, run["false_verdict_nodes"]


def test_scale_bench_with_link_shards_runs_one_and_three_replicas_side_by_side(capsys):
    assert cli.main(["bench", "scale", "--json", "--nodes", "90", "--intervals", "1", "--duration-s", "10",
                     "--step-s", "2", "--sweep", "", "--replicas", "1,3", "--kill-shard", "--snapshot-reports"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["replicas"] == [1, 3] and set(result["runs_by_replicas"]) == {"1", "3"}
    single, sharded = result["runs_by_replicas"]["1"]["1"], result["runs_by_replicas"]["3"]["1"]
    for run in (single, sharded):
        assert "error" not in run, run.get("error")
        assert run["nodes_connected"] == run["nodes_training"] == 90 and run["false_verdicts"] == 0
        assert run["detect_s"] is not None, "the silenced node is declared dead, through its shard too"
        assert run["heartbeats_acked"] >= 0.9 * run["heartbeats_asked_ack"]
        # Every node reports its holdings and its buddy copies each step, so steps commit (at
        # least the two before the node falls silent at 5 s), and each commit reaches the
        # nodes as SnapshotRetain notices, not as a directive each.
        assert run["snapshot_commits"] >= 1 and run["retain_notices_received"] >= 80, run
    assert single["replicas"] == 1 and single["shard_cpu_fractions"] == {}
    assert sharded["replicas"] == 3 and len(sharded["shard_cpu_fractions"]) == 2
    folds = sharded["leader_step_folds"]
    assert folds is not None and folds["folds"] > 0, "the shards' nodes' step aggregates reached the leader in folds"
    assert folds["aggregates_per_fold"] > 1
    assert all(cpu > 0 for cpu in sharded["shard_cpu_fractions"].values()), "the shards carried their nodes"
    admitted = sharded["shard_liveness_admitted"]
    assert set(admitted) == set(sharded["shard_cpu_fractions"]), admitted
    assert all(a["count"] > 0 and a["p50_ms_at_most"] is not None for a in admitted.values()), \
        "each shard measured its liveness summaries' admission"
    assert single["shard_liveness_admitted"] == {}
    assert len(sharded["loop_late"]) == 3 and all(late["ticks"] > 0 for late in sharded["loop_late"].values()), \
        "every replica's ticker was measured"
    # A follower SIGKILLed after the window: its nodes dial their next shard and are heard again
    # there, and nobody is judged.
    kill = sharded["shard_kill"]
    assert kill["killed"] in sharded["shard_cpu_fractions"] and kill["nodes_on_it"] > 0
    assert kill["moved"] >= kill["nodes_on_it"] - 1  # (less the silenced node, when it was there)
    assert kill["heard_again"] == kill["moved"], kill
    assert kill["deaths_after_kill"] == 0, kill
    assert "shard_kill" not in single


def test_a_leader_kill_under_the_scale_bench_keeps_the_followers_streams(capsys):
    """Three replicas, the leader SIGKILLed after the window: the new leader welcomes every node,
    the nodes of the follower that goes on following through their kept streams (only the new
    leader's own former share redials), and nobody is judged."""
    assert cli.main(["bench", "scale", "--json", "--nodes", "90", "--intervals", "1", "--duration-s", "6",
                     "--step-s", "2", "--sweep", "", "--replicas", "3", "--kill-leader"]) == 0
    run = json.loads(capsys.readouterr().out)["runs_by_replicas"]["3"]["1"]
    assert "error" not in run, run.get("error")
    kill = run["leader_kill"]
    assert kill["new_leader"] != kill["killed"] and kill["nodes"] >= 89
    assert kill["welcomed_again"] == kill["nodes"], kill
    assert kill["redialled"] < kill["nodes"], f"the other follower's nodes kept their streams: {kill}"
    assert kill["deaths_after_kill"] == 0, kill
