"""`ftsup sim`'s command line: the JSON scripts rely on, the human tables, and clear errors."""

from __future__ import annotations

import json
import math

import pytest

from ftsup.harness import cli as ftsup_cli
from ftsup.harness.sim.cli import main

SMALL = ["--gpus", "64", "--gpus-per-node", "8", "--component", "gpu:50000:8", "--component", "nic:100000:2",
         "--job-days", "2", "--checkpoint-s", "60", "--runs", "2"]


def _json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_closed_form_numbers_exactly_and_an_ettr_per_strategy(capsys):
    out = _json(capsys, SMALL)
    node_mtbf = 1 / (8 / 50_000 + 2 / 100_000)
    assert out["node_mtbf_h"] == node_mtbf
    assert out["fleet_mtbf_h"] == node_mtbf / 8
    assert out["expected_failures"] == 48 / (node_mtbf / 8)
    assert out["young_daly_interval_h"] == math.sqrt(2 * (60 / 3600) * (node_mtbf / 8))
    assert out["young_daly_formula"].startswith("sqrt(2 * checkpoint_s * fleet_mtbf)")
    assert set(out["strategies"]) == {"checkpoint_only", "ftsup"}
    for strategy in out["strategies"].values():
        assert 0 < strategy["ettr"] <= 1
        assert strategy["runs"] == 2 and len(strategy["ettr_ci95"]) == 2
        assert sum(strategy["breakdown"].values()) == pytest.approx(1.0)
        assert 0 < strategy["ettr_expected"] <= 1


def test_the_issue_interface_works_with_defaults_for_everything_else(capsys):
    out = _json(capsys, ["--gpus", "16", "--gpus-per-node", "8", "--component", "gpu:50000:8", "--job-days", "1",
                         "--checkpoint-s", "30", "--strategy", "ftsup"])
    assert set(out["strategies"]) == {"ftsup"}
    assert out["strategies"]["ftsup"]["runs"] == 10  # small fleets get replications by default


def test_a_sweep_prints_one_object_per_gpu_count_under_sweep(capsys):
    out = _json(capsys, SMALL + ["--sweep", "16,64"])
    assert [r["gpus"] for r in out["sweep"]] == [16, 64]
    assert out["sweep"][0]["fleet_mtbf_h"] == 4 * out["sweep"][1]["fleet_mtbf_h"]


def test_human_output_shows_the_numbers_and_a_row_per_strategy(capsys):
    assert main(SMALL) == 0
    text = capsys.readouterr().out
    assert "fleet MTBF" in text and "Young/Daly" in text and "expected failures" in text
    assert "checkpoint_only" in text and "ftsup" in text
    assert main(SMALL + ["--sweep", "16,64"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "ftsup " in line]
    assert len(rows) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "0"], "--gpus must be >= 1, got 0"),
        (["--gpus", "100"], "--gpus 100 is not divisible by --gpus-per-node 8"),
        (["--component", "gpu:-5:8"], "MTTF must be a positive number of hours, got -5.0"),
        (["--component", "gpu:5000"], "--component 'gpu:5000' is not NAME:MTTF_HOURS:COUNT_PER_NODE"),
        (["--sweep", "8,x"], "--sweep '8,x' is not a comma-separated list"),
        (["--runs", "0"], "--runs must be within [1, 10000], got 0"),
        (["--job-days", "-1"], "--job-days must be within"),
        (["--jobs", "0"], "--jobs must be within [1, 256], got 0"),
    ],
)
def test_bad_flags_exit_2_naming_the_value(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_job_that_cannot_finish_is_reported_for_that_strategy(capsys):
    out = _json(capsys, ["--gpus", "64", "--component", "node:1:1", "--restart-s", "7200", "--job-days", "1",
                         "--strategy", "checkpoint_only"])
    report = out["strategies"]["checkpoint_only"]
    assert report["ettr"] is None and "renewal model expects" in report["error"]


def test_ftsup_lists_sim_and_dispatches_to_it(capsys):
    assert "sim" in ftsup_cli.SUBCOMMANDS
    assert ftsup_cli.main(["sim", "--gpus", "0"]) == 2
    assert "--gpus must be >= 1" in capsys.readouterr().err


def test_replications_in_several_processes_give_the_same_numbers(capsys):
    one = _json(capsys, SMALL + ["--sweep", "16,64", "--jobs", "1"])
    two = _json(capsys, SMALL + ["--sweep", "16,64", "--jobs", "2"])
    for fleet in (*one["sweep"], *two["sweep"]):
        fleet.pop("cpu_s")
    assert [f.pop("jobs") for f in one["sweep"]] == [1, 1] and [f.pop("jobs") for f in two["sweep"]] == [2, 2]
    assert one == two


def _fake_replication(task):  # run in a forked worker: the first fails, the others would take long
    import os
    import pathlib
    import time

    marks = pathlib.Path(task.strategy)
    (marks / f"{task.run}.{os.getpid()}").touch()
    if task.run == 0:
        raise RuntimeError("replication 0 broke")
    time.sleep(20)  # stands for a long replication; the pool must not wait for it


def test_a_failed_or_stopped_replication_ends_the_pool_at_once_queued_runs_never_start(tmp_path, monkeypatch):
    import os

    from ftsup.harness.sim import cli as sim_cli
    from tests.support.process_tree import descendants

    monkeypatch.setattr(sim_cli, "_run_task", _fake_replication)
    spec = sim_cli.SimSpec(gpus=8)
    tasks = [sim_cli._Task(spec, str(tmp_path), i, i) for i in range(8)]
    with pytest.raises(RuntimeError, match="replication 0 broke"):
        sim_cli._run_all(tasks, jobs=2)
    marks = [p.name.split(".") for p in tmp_path.iterdir()]
    started, workers = sorted(int(run) for run, _ in marks), {int(pid) for _, pid in marks}
    assert started[0] == 0 and len(started) < len(tasks), started  # the queued ones were cancelled
    assert not workers & set(descendants(os.getpid())), "a worker of the pool is still running"
