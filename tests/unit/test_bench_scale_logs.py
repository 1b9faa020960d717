"""`ftsup bench scale` keeps a run's logs when it saw false verdicts, even without --workdir."""

from __future__ import annotations

import argparse
import pathlib
import shutil
from typing import Any

import pytest

from ftsup.bench import scale


def _run_writing_logs(verdicts: int) -> Any:
    def run_once(args: argparse.Namespace, nodes: int, interval: float, workdir: pathlib.Path, profile: bool,
                 replicas: int) -> dict[str, Any]:
        workdir.mkdir(parents=True)
        (workdir / "supervisor-1.log").write_text("what the leader said\n")
        (workdir / "job.json").write_text("{}")
        (workdir / "etcd").mkdir()  # (data directories are not kept)
        return {"nodes": nodes, "false_verdicts": verdicts}
    return run_once


@pytest.mark.parametrize("verdicts", [0, 3])
def test_a_run_with_false_verdicts_keeps_its_logs(monkeypatch, tmp_path, verdicts):
    monkeypatch.setattr(scale, "run_once", _run_writing_logs(verdicts))
    out = scale._safe(argparse.Namespace(workdir=None), 10, 5.0, tmp_path / "run")
    if not verdicts:
        assert "logs_kept" not in out
        return
    kept = pathlib.Path(out["logs_kept"])
    try:
        assert sorted(p.name for p in kept.iterdir()) == ["job.json", "supervisor-1.log"]
        assert (kept / "supervisor-1.log").read_text() == "what the leader said\n"
    finally:
        shutil.rmtree(kept)


def test_with_a_work_directory_nothing_is_copied(monkeypatch, tmp_path):
    monkeypatch.setattr(scale, "run_once", _run_writing_logs(5))
    out = scale._safe(argparse.Namespace(workdir=tmp_path), 10, 5.0, tmp_path / "run")
    assert "logs_kept" not in out and (tmp_path / "run" / "supervisor-1.log").exists()
