"""`ftsup sim --plot`: the numbers each panel draws, and a whole PNG from a tiny simulation."""

from __future__ import annotations

import json
import pathlib

import pytest

from ftsup.common import plot
from ftsup.harness.sim import plot as sim_plot
from ftsup.harness.sim.cli import main
from tests.support.png import png_size

TINY = ["--gpus-per-node", "8", "--component", "gpu:50000:8", "--job-days", "1", "--checkpoint-s", "60", "--runs", "2"]


def strategy(ettr: float, ci: tuple[float, float] | None, lost: float) -> dict:
    breakdown = {"useful": ettr, "checkpoint_pauses": 0.01, "snapshot_pauses": 0.0, "detection": 0.0,
                 "waiting_for_spares": 0.0, "restart": 0.0, "lost_work": lost}
    return {"ettr": ettr, "ettr_ci95": list(ci) if ci else None, "ettr_expected": ettr - 0.001, "breakdown": breakdown}


def test_plot_data_orders_by_gpus_keeps_intervals_within_0_1_and_lists_what_did_not_finish() -> None:
    results = [
        {"gpus": 4096, "strategies": {"checkpoint_only": {"ettr": None, "error": "no progress", "ettr_expected": 0.0},
                                      "ftsup": strategy(0.97, (0.96, 0.98), 0.001)}},
        {"gpus": 256, "strategies": {"checkpoint_only": strategy(0.95, (0.90, 1.02), 0.03),
                                     "ftsup": strategy(0.98, None, 0.0)}},
    ]
    data = sim_plot.plot_data(results)
    assert data["curves"]["checkpoint_only"] == {"gpus": [256], "ettr": [0.95], "ci95": [(0.90, 1.0)],
                                                 "model": [0.949]}
    assert data["curves"]["ftsup"]["gpus"] == [256, 4096] and data["curves"]["ftsup"]["ci95"] == [None, (0.96, 0.98)]
    assert [(b["gpus"], b["strategy"]) for b in data["bars"]] == [(256, "checkpoint_only"), (256, "ftsup"), (4096, "ftsup")]
    assert data["bars"][0]["productive"] == 0.95 and data["bars"][0]["losses"]["lost_work"] == 0.03
    assert data["errors"] == [{"gpus": 4096, "strategy": "checkpoint_only", "error": "no progress"}]


def test_sim_plot_writes_a_png_and_still_prints_its_json(tmp_path: pathlib.Path, capsys) -> None:
    target = tmp_path / "sim.png"
    assert main(["--sweep", "16,64", *TINY, "--json", "--plot", str(target)]) == 0
    assert len(json.loads(capsys.readouterr().out)["sweep"]) == 2
    width, height = png_size(target)
    assert width > 800 and height > 400
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize("name, message", [("out.jpg", "ending in .png"), ("missing/out.png", "does not exist")])
def test_a_bad_plot_path_exits_2_before_simulating(tmp_path: pathlib.Path, capsys, name: str, message: str) -> None:
    assert main(["--gpus", "16", *TINY, "--plot", str(tmp_path / name)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_without_matplotlib_the_error_names_the_extra(monkeypatch, tmp_path: pathlib.Path, capsys) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(plot.PlotUnavailable, match=r"ftsup\[plot\]"):
        plot.pyplot()
    assert main(["--gpus", "16", *TINY, "--plot", str(tmp_path / "x.png")]) == 2
    assert "ftsup[plot]" in capsys.readouterr().err
