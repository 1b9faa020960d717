"""`ftsup bench scale` keeps a run's logs when its figures need them (false verdicts, no detection, a
sharded leader with no step fold, a failed run), even without --workdir."""

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
        return {"nodes": nodes, "false_verdicts": verdicts, "detect_s": 10.1}
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


HEALTHY = {"nodes": 6000, "replicas": 3, "false_verdicts": 0, "detect_s": 10.1,
           "leader_step_folds": {"folds": 500, "aggregates": 24000}}


@pytest.mark.parametrize(("change", "reason"), [
    ({}, None),
    ({"false_verdicts": 2}, "2 false verdicts"),
    ({"detect_s": None}, "the silenced node was not declared dead"),
    ({"leader_step_folds": {"folds": 0, "aggregates": 0}}, "the leader decided no step fold"),
    ({"leader_step_folds": {"folds": 0, "aggregates": 0}, "replicas": 1}, None),  # (no shards, no folds)
    ({"error": "12 nodes dead while connecting"}, "the run failed"),
])
def test_what_a_runs_logs_must_explain(change, reason):
    reasons = scale.unexplained({**HEALTHY, **change})
    assert reasons == ([] if reason is None else [reason])


def test_a_failed_run_keeps_its_logs(monkeypatch, tmp_path):
    def run_once(args: argparse.Namespace, nodes: int, interval: float, workdir: pathlib.Path, profile: bool,
                 replicas: int) -> dict[str, Any]:
        workdir.mkdir(parents=True)
        (workdir / "load-0.log").write_text("connect timed out\n")
        raise scale.ClusterError("12 nodes dead while connecting")
    monkeypatch.setattr(scale, "run_once", run_once)
    out = scale._safe(argparse.Namespace(workdir=None), 10, 5.0, tmp_path / "run")
    kept = pathlib.Path(out["logs_kept"])
    try:
        assert out["error"] == "12 nodes dead while connecting" and out["logs_kept_because"] == ["the run failed"]
        assert (kept / "load-0.log").read_text() == "connect timed out\n"
    finally:
        shutil.rmtree(kept)


def _while_connecting() -> int:
    return sum(range(50))


def _before_the_silence() -> int:
    return sum(range(100))


def _after_it() -> int:
    return sum(range(200))


def _profile_a_run(directory: pathlib.Path, *, profiled_while_connecting: bool) -> dict[str, set[str]]:
    """bench scale's signals to a profiled supervisor over a run's three parts (SIGUSR1 as the fleet
    connects, for the leader only; SIGHUP at the window and at the silence; SIGUSR2 at the end):
    which of the parts' functions each written profile holds, by file name."""
    import os
    import pstats
    import signal

    from ftsup.bench import _profiled_supervisor

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)}
    directory.mkdir()
    try:
        _profiled_supervisor._install(str(directory / "steady.prof"), str(directory / "tail.prof"),
                                      str(directory / "connect.prof"))
        if profiled_while_connecting:
            os.kill(os.getpid(), signal.SIGUSR1)
        _while_connecting()
        os.kill(os.getpid(), signal.SIGHUP)
        _before_the_silence()
        os.kill(os.getpid(), signal.SIGHUP)
        _after_it()
        os.kill(os.getpid(), signal.SIGUSR2)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    parts = {"_while_connecting", "_before_the_silence", "_after_it"}
    return {path.name: {name for (_, _, name) in pstats.Stats(str(path)).stats} & parts  # type: ignore[attr-defined]
            for path in directory.glob("*.prof")}


def test_the_profile_is_cut_at_the_window_and_at_the_silence(tmp_path):
    # The leader: each SIGHUP writes what came before and goes on into the next file (the
    # window, then the tail), SIGUSR2 writes the last: three profiles, each of its own part.
    assert _profile_a_run(tmp_path / "leader", profiled_while_connecting=True) == {
        "connect.prof": {"_while_connecting"}, "steady.prof": {"_before_the_silence"}, "tail.prof": {"_after_it"}}
    # A shard is not profiled while the fleet connects: its first SIGHUP starts the window's part.
    assert _profile_a_run(tmp_path / "shard", profiled_while_connecting=False) == {
        "steady.prof": {"_before_the_silence"}, "tail.prof": {"_after_it"}}


def test_a_false_verdict_is_told_apart_when_the_load_generator_left_its_node_silent():
    # 5 s heartbeats: suspicion after 7.5 s; a node the generator sent nothing of
    # is silent at the source from 7.3 s (a summary's gather and a Tick are the rest).
    results = [{"send_gaps_s": {"a": 7.6, "b": 5.4}, "write_waits_s": {"a": 0.3}},
               {"send_gaps_s": {"c": 7.2, "d": 9.0}}]
    told = scale._silent_at_source(results, ["a", "b", "e"], 7.5)
    assert told["nodes_silent_at_source"] == 2  # a, d
    assert told["false_verdicts_silent_at_source"] == 1  # a; b was sent on time, e never late
    assert told["false_verdict_sources"] == {"a": {"send_gap_s": 7.6, "write_wait_s": 0.3},
                                             "b": {"send_gap_s": 5.4, "write_wait_s": None},
                                             "e": {"send_gap_s": None, "write_wait_s": None}}


def test_the_load_generator_reports_its_longest_silences_first_and_bounded():
    from ftsup.harness import fleet_load

    gaps = {f"n{i}": float(i) for i in range(fleet_load.MAX_GAPS_REPORTED + 10)}
    longest = fleet_load._longest(gaps)
    assert len(longest) == fleet_load.MAX_GAPS_REPORTED
    assert next(iter(longest)) == f"n{fleet_load.MAX_GAPS_REPORTED + 9}" and "n0" not in longest


def test_a_silence_the_windows_end_cuts_short_counts_as_a_gap():
    from ftsup.harness import fleet_load

    quiet = fleet_load.SimNode("quiet", 1, interval_s=5.0, handed_at=100.0)
    talking = fleet_load.SimNode("talking", 1, interval_s=5.0, handed_at=106.0)
    silenced = fleet_load.SimNode("silenced", 1, interval_s=5.0, handed_at=90.0, is_silenced=True)
    counters = fleet_load.Counters(send_gaps_s={"talking": 5.5})
    fleet_load._note_open_gaps([quiet, talking, silenced], 108.0, counters)
    assert counters.send_gaps_s == {"quiet": 8.0, "talking": 5.5}
