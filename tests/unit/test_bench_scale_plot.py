"""`ftsup bench scale --plot`: the points drawn from a scale result, and a PNG from a saved one."""

from __future__ import annotations

import json
import pathlib

import pytest

from ftsup.bench import _scale_plot, scale
from tests.support.png import png_size


def run(nodes: int, interval: float, p50: float, p99: float, cpu: float, **extra) -> dict:
    return {"nodes": nodes, "heartbeat_interval_s": interval, "latency_p50_ms": p50, "latency_p99_ms": p99,
            "supervisor_cpu_fraction": cpu, **extra}


RESULT = {
    "nodes": 5000, "cpus": 2, "goal": {"latency_p99_ms": 50.0},
    "runs": {"5": run(5000, 5.0, 2.0, 9.0, 0.31), "1": run(5000, 1.0, 30.0, 240.0, 0.97)},
    "sweep_1s": {"1000": run(1000, 1.0, 1.5, 7.0, 0.22), "2500": run(2500, 1.0, 4.0, 38.0, 0.55),
                 "4000": {"nodes": 4000, "heartbeat_interval_s": 1.0, "goal_met": False, "error": "connect timeout"}},
}


def test_points_are_grouped_by_interval_sorted_by_nodes_and_broken_runs_listed() -> None:
    data = _scale_plot.plot_data(RESULT)
    assert list(data["series"]) == ["1", "5"]
    assert data["series"]["1"] == {"nodes": [1000, 2500, 5000], "latency_p50_ms": [1.5, 4.0, 30.0],
                                   "latency_p99_ms": [7.0, 38.0, 240.0], "supervisor_cpu_fraction": [0.22, 0.55, 0.97]}
    assert data["series"]["5"]["nodes"] == [5000]
    assert data["errors"] == [{"interval_s": "1", "nodes": 4000, "error": "connect timeout"}]
    assert data["goal_p99_ms"] == 50.0


def test_a_saved_result_draws_a_png_without_running_the_benchmark(tmp_path: pathlib.Path) -> None:
    saved = tmp_path / "scale.json"
    saved.write_text(json.dumps(RESULT))
    assert scale.main(["--plot", str(tmp_path / "scale.png"), "--from-json", str(saved)]) == 0
    assert png_size(tmp_path / "scale.png")[0] > 800


def test_from_json_needs_plot_and_a_scale_result(tmp_path: pathlib.Path, capsys) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"sweep": []}')
    for argv, message in ((["--from-json", str(other)], "add --plot"),
                          (["--plot", str(tmp_path / "x.png"), "--from-json", str(other)], "not an `ftsup bench scale`"),
                          (["--plot", str(tmp_path / "x.png"), "--from-json", str(tmp_path / "none.json")], "not a readable")):
        with pytest.raises(SystemExit) as exit_info:
            scale.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
