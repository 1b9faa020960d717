"""`ftsup bench`: lists the benchmarks and runs one (the straggler bench in its --quick form)."""

from __future__ import annotations

import json

import pytest

from ftsup.harness import cli


def test_bench_help_lists_the_straggler_bench(capsys):
    assert cli.main(["bench", "--help"]) == 0
    assert "straggler" in capsys.readouterr().out


def test_unknown_bench_is_a_usage_error(capsys):
    assert cli.main(["bench", "no_such_bench"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


def test_straggler_bench_quick_prints_one_json_object_with_the_required_keys(capsys):
    assert cli.main(["bench", "straggler", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"recall_by_slowdown", "delay_steps_by_slowdown", "false_quarantines", "baseline"} <= set(result)
    assert set(result["recall_by_slowdown"]) == {"0.05", "0.10", "0.20", "0.50"}
    assert "false_quarantines" in result["baseline"]


def test_eventlog_bench_quick_compares_with_sqlite_and_replays(capsys, tmp_path):
    assert cli.main(["bench", "eventlog", "--quick", "--json", "--dir", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"append_eps_1", "append_eps_64", "sqlite_eps_64", "ratio_64", "replay_from_snapshot_s"} <= set(result)
    assert result["append_eps_64"] > 0 and result["sqlite_eps_64"] > 0
    assert result["ratio_64"] == round(result["append_eps_64"] / result["sqlite_eps_64"], 2)


def test_registration_bench_quick_registers_in_batches_without_false_verdicts(capsys, tmp_path):
    argv = ["bench", "registration", "--quick", "--json", "--nodes", "40", "--ranks-per-node", "1",
            "--interval-s", "0.5", "--dir", str(tmp_path)]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    (run,) = result["runs"]
    assert run["registered"] == 40 and run["generation_started_s"] is not None
    assert run["appends"] < 40, "Hellos queued together were appended together"
    assert run["false_suspects"] == 0 and run["false_deaths"] == 0


def test_codec_bench_quick_compares_compiled_adders_with_the_field_by_field_baseline(capsys):
    assert cli.main(["bench", "codec", "--quick", "--json", "--nodes", "50", "--ranks-per-node", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    for shape in ("generation_started", "state_snapshot"):
        figures = result[shape]
        assert figures["bytes"] > 50 * 2 * 10  # one restore entry per rank, at least
        assert figures["encode_s"] > 0 and figures["baseline_encode_s"] > 0


def test_core_step_bench_runs_by_its_hyphenated_name_and_both_paths_decide_the_same(capsys):
    assert cli.main(["bench", "core-step", "--json", "--nodes", "8,16", "--steps", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [run["nodes"] for run in result["runs"]] == [8, 16] and "per_rank" in result["baseline"]
    for run in result["runs"]:
        assert run["same_decisions"] is True and run["ranks"] == run["nodes"] * 8
        for path in ("aggregated", "per_rank"):
            assert len(run[path]["cpu_s_per_step"]) == 2
            assert set(run[path]["core_fraction_at_step_s"]) == {"2", "10"}


def test_core_step_bench_by_fold_size_decides_the_same_at_every_size(capsys):
    assert cli.main(["bench", "core-step", "--json", "--nodes", "12", "--steps", "2", "--fold-sizes", "1,5,12"]) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["same_decisions"] is True and set(run["by_fold_size"]) == {"1", "5", "12"}
    assert all(size["median_cpu_s_per_step"] > 0 for size in run["by_fold_size"].values())
    assert cli.main(["bench", "core-step", "--fold-sizes", "0"]) == 2


def test_checkpoint_fold_bench_counts_every_shard_both_ways_and_projects_past_the_baselines_cap(capsys):
    assert cli.main(["bench", "checkpoint-fold", "--json", "--ranks", "50,200", "--baseline-max", "50"]) == 0
    result = json.loads(capsys.readouterr().out)
    small, large = result["sizes"]
    assert (small["ranks"], large["ranks"]) == (50, 200)
    assert small["cpu_s"] > 0 and small["baseline_tuples_cpu_s"] > 0  # (each asserts every shard was counted)
    assert "baseline_tuples_cpu_s" not in large
    assert large["baseline_tuples_projected_s"] == pytest.approx(small["baseline_tuples_cpu_s"] * 16, abs=0.1)  # x (200/50)^2


def test_checkpoint_fold_bench_refuses_sizes_it_cannot_read(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "checkpoint-fold", "--ranks", "ten"])
    assert "comma-separated list of integers" in capsys.readouterr().err


def test_detector_pass_bench_gives_the_baselines_verdicts_with_fewer_passes(capsys):
    assert cli.main(["bench", "detector-pass", "--json", "--nodes", "40", "--interval-s", "1", "--seconds", "5"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["same_verdicts"] is True and run["dead_as_expected"] is True
    assert 0 < run["passes"] < run["ticks"] == 50


def test_step_metrics_bench_exposes_the_baselines_figures(capsys):
    assert cli.main(["bench", "step-metrics", "--json", "--nodes", "30", "--steps", "2"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["same_figures"] is True and run["ranks"] == 240
    assert run["arrays"]["median_cpu_s_per_step"] > 0 and run["per_value"]["median_cpu_s_per_step"] > 0


def test_directive_push_bench_encodes_as_the_baseline_does(capsys):
    assert cli.main(["bench", "directive-push", "--json", "--nodes", "12", "--repeats", "2"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["same_messages"] is True and run["ranks"] == 96 and run["push_s"] > 0


def test_commit_push_bench_answers_commits_with_notices_and_its_baseline_with_directives(capsys):
    assert cli.main(["bench", "commit-push", "--json", "--nodes", "6", "--repeats", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["commits"] == 2 and result["ranks"] == 48
    notices, directives = result["notices"], result["baseline_directives"]
    assert notices["messages_per_commit"] == directives["messages_per_commit"] == 6
    assert notices["bytes_per_commit"] < directives["bytes_per_commit"]


def test_metrics_scrape_bench_lists_the_worst_nodes_past_the_limit_and_every_node_in_its_baseline(capsys):
    assert cli.main(["bench", "metrics-scrape", "--json", "--nodes", "8", "--limit", "3", "--repeats", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    limited, whole = result["limited"], result["baseline_every_node"]
    assert limited["node_xid_series"] == 3 and whole["node_xid_series"] == 8, "5 nodes have Xids; the limit is 3"
    assert limited["samples"] < whole["samples"] and limited["median_cpu_s"] >= 0
