"""bench/peers.py's pure parts: flags, step lines, one kill's figures, the per-tool summary and
ftsup's ratio to the best peer; and how it starts NVRx's in-process flavour and ends what that
leaves outside its process tree (with a stand-in for the peers' python). No peer needs to be
installed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from ftsup.bench.peers import (
    NEEDS_PEERS_VENV,
    PEERS,
    Launch,
    PlannedRun,
    StepRecord,
    aggregate,
    baseline_step_s,
    goals,
    launch_tool,
    measure_kill,
    overhead_pct,
    parse_args,
    parse_lines,
    pids_naming,
    plan_runs,
    ratios,
    run_span_s,
    spread,
    steady_step_s,
)


def recs(epoch: int, steps: range, t0: float, dt: float, world: int | None = None) -> list[StepRecord]:
    return [StepRecord(epoch, s, t0 + i * dt, world) for i, s in enumerate(steps)]


def test_flags_are_checked_and_tools_listed_by_name():
    args = parse_args(["--tools", "torchrun,ftsup", "--repeats", "3"])
    assert args.tools == ["torchrun", "ftsup"] and args.repeats == 3 and args.kill_at == 35
    with pytest.raises(SystemExit):
        parse_args(["--tools", "torchelastic"])
    with pytest.raises(SystemExit):
        parse_args(["--kill-at", "70", "--steps", "60"])
    with pytest.raises(SystemExit):
        parse_args(["--repeats", "0"])


def test_step_lines_carry_their_own_time_or_take_the_time_seen():
    out = parse_lines(2, b"step 7 world 3 t 100.5 loss 1.0\nstep 8 loss 2.0 step_ms 3\n", seen_at=200.0)
    assert out == [StepRecord(2, 7, 100.5, 3), StepRecord(2, 8, 200.0, None)]


def test_a_restart_counts_only_steps_of_a_later_attempt_and_the_redone_ones_as_lost():
    before = recs(0, range(1, 36), 0.0, 0.1)  # steps 1..35 at t 0.0..3.4
    late = [StepRecord(0, 36, 3.45)]  # finished as the kill landed: not a recovery
    after = recs(1, range(31, 41), 20.0, 0.1)  # restored from step 30
    k = measure_kill(before + late + after, killed_at=3.42, full_world=None, continuous=False)
    assert (k["at_step"], k["first_step"], k["lost_steps"]) == (35, 31, 5)
    assert k["recovery_s"] == round(20.0 - 3.42, 3)
    assert k["regain_s"] == round(20.4 - 3.42, 3)  # step 35 again


def test_a_tool_that_trains_on_reports_when_the_whole_world_is_back_and_how_fast_it_went():
    before = recs(0, range(1, 36), 0.0, 0.1, world=4)
    reduced = recs(0, range(36, 46), 8.0, 0.5, world=2)
    back = recs(0, range(46, 50), 14.0, 0.1, world=4)
    k = measure_kill(before + reduced + back, killed_at=3.45, full_world=4, continuous=True)
    assert (k["lost_steps"], k["first_step"]) == (0, 36)
    assert k["full_world_s"] == round(14.0 - 3.45, 3)
    assert k["reduced_step_s"] == 0.5 and k["reduced_steps"] == 10
    assert k["samples_lost_steps"] == 5.0  # 10 steps at half the world
    never = measure_kill(before + reduced, killed_at=3.45, full_world=4, continuous=True)
    assert never["full_world_s"] is None and never["full_world_after_s"] == round(12.5 - 3.45, 3)


def test_no_step_after_the_kill_leaves_the_figures_missing_not_zero():
    k = measure_kill(recs(0, range(1, 10), 0.0, 0.1), killed_at=5.0, full_world=None, continuous=False)
    assert k["recovery_s"] is None and k["lost_steps"] is None
    with pytest.raises(ValueError):
        measure_kill([], killed_at=1.0, full_world=None, continuous=False)


def test_steady_state_skips_warm_up_and_a_smaller_world():
    records = recs(0, range(1, 6), 0.0, 1.0, world=4) + recs(0, range(6, 26), 5.0, 0.2, world=4)
    assert steady_step_s(records, skip=5) == 0.2
    assert steady_step_s(recs(0, range(1, 30), 0.0, 0.3, world=2), skip=5, full_world=4) is None
    assert run_span_s(records, 25) == round(5.0 + 19 * 0.2, 3)


def test_summary_gives_median_and_spread_and_ftsup_over_the_best_peer():
    assert spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3, "missing": 1}
    assert spread([None]) is None

    def tool(regain: list[float], step_s: float) -> dict:
        kills = [{"regain_s": r, "recovery_s": r, "lost_steps": 0, "peak_rss_mib": 100.0, "step_s": None}
                 for r in regain]
        return aggregate("x", {"step_s": step_s, "peak_rss_mib": 90.0}, kills, plain_step_s=0.1)

    tools = {"torchrun": tool([20.0, 30.0, 25.0], 0.11), "torchft": tool([5.0, 6.0, 7.0], 0.12),
             "ftsup": tool([2.0, 3.0, 4.0], 0.115), "plain": tool([], 0.1)}
    assert tools["ftsup"]["figures"]["overhead_pct"]["median"] == 15.0
    assert tools["ftsup"]["figures"]["step_s"]["missing"] == 3  # no pre-kill sample: counted, not zero
    r = ratios(tools)
    assert r["regain_s"] == {"best_peer": "torchft", "peer": 6.0, "ftsup": 3.0, "ratio": 0.5}
    assert r["overhead_pct"]["best_peer"] == "torchrun" and r["overhead_pct"]["difference_pp"] == 5.0
    g = goals(tools, r)
    assert g["regain_goal_met"] and g["lost_goal_met"] and not g["overhead_goal_met"]


def test_plain_ddp_runs_in_every_round_beside_each_tool_and_each_tool_runs_once_a_round():
    runs = plan_runs(["torchft", "plain", "ftsup"], repeats=3)
    rounds = [[(r.tool, r.kill, r.index) for r in runs if r.round == n] for n in range(4)]
    assert len(runs) == 12 and {r.round for r in runs} == {0, 1, 2, 3}
    # Round 0: every tool failure-free, plain first (the others' overhead needs its baseline).
    assert rounds[0] == [("plain", False, 1), ("torchft", False, 1), ("ftsup", False, 1)]
    # Round r: each other tool's r-th kill and plain's (r+1)-th failure-free run, rotated.
    assert rounds[1] == [("torchft", True, 1), ("ftsup", True, 1), ("plain", False, 2)]
    assert rounds[2] == [("ftsup", True, 2), ("plain", False, 3), ("torchft", True, 2)]
    assert rounds[3] == [("plain", False, 4), ("torchft", True, 3), ("ftsup", True, 3)]
    assert [r.name for r in runs if r.tool == "plain"] == ["clean", "clean-2", "clean-3", "clean-4"]
    assert [r.name for r in runs if r.tool == "ftsup"] == ["clean", "kill-1", "kill-2", "kill-3"]
    # Without plain there is no baseline run; with it alone, only failure-free runs.
    assert all(r.tool != "plain" for r in plan_runs(["torchrun"], 2))
    assert plan_runs(["plain"], 2) == [PlannedRun(n, "plain", False, n + 1) for n in range(3)]
    with pytest.raises(ValueError):
        plan_runs(["plain"], 0)


def test_overhead_is_taken_against_the_median_of_plain_runs_so_one_load_spike_moves_nothing():
    plain = [{"step_s": 0.05}, {"step_s": 0.134}, {"step_s": 0.049}, {"step_s": None}, {"step_s": 0.051}]
    assert baseline_step_s(plain) == 0.0505  # the spike (0.134) and the run without a figure left aside
    assert baseline_step_s([{"step_s": None}]) is None
    assert overhead_pct(0.0606, 0.0505) == 20.0
    assert overhead_pct(None, 0.05) is None and overhead_pct(0.05, None) is None
    tool = aggregate("ftsup", {"step_s": 0.0505}, [{"step_s": 0.0606}, {"step_s": 0.0404}], baseline_step_s(plain))
    assert tool["figures"]["overhead_pct"] == {"median": 0.0, "min": -20.0, "max": 20.0, "n": 3, "missing": 0}
    # Plain's own figures: median/min/max/n over all its failure-free runs, each kept.
    summary = aggregate("plain", plain[0], [], None, more_clean=plain[1:])
    assert summary["figures"]["step_s"] == {"median": 0.0505, "min": 0.049, "max": 0.134, "n": 4, "missing": 1}
    assert len(summary["clean_runs"]) == 5 and "overhead_pct" not in summary["figures"]


def test_repeats_default_to_five_and_the_in_process_flavour_is_a_peer():
    args = parse_args(["--tools", "nvrx,nvrx-inprocess"])
    assert args.repeats == 5 and args.tools == ["nvrx", "nvrx-inprocess"]
    assert "nvrx-inprocess" in PEERS and "nvrx-inprocess" in NEEDS_PEERS_VENV


FAKE_RANK = """#!/bin/sh
# Stands in for the peers' python: records what a rank was started with, writes its pid as the
# trainer does, and exits.
args="$*"
while [ $# -gt 0 ]; do
  if [ "$1" = "--dir" ]; then dir="$2"; fi
  shift
done
echo "$args" > "$dir.argv.$RANK"
mkdir -p "$dir/pids"
env > "$dir/env-$RANK"
echo $$ > "$dir/pids/rank-$RANK"
"""


def test_nvrx_inprocess_starts_one_process_per_rank_with_a_reserve_node_and_kills_ranks_2_and_3(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_RANK)
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    args = parse_args(["--tools", "nvrx-inprocess", "--peers-python", str(fake)])
    launch = launch_tool("nvrx-inprocess", args, run_dir)
    try:
        assert len(launch.processes) == 6  # 2 nodes x 2 ranks + a reserve node of 2
        for p in launch.processes:
            assert p.wait(timeout=60) == 0
    finally:
        launch.stop(timeout_s=5, strays_grace_s=0.5)
    envs = []
    for rank in range(6):
        pairs = (line.split("=", 1) for line in (run_dir / f"env-{rank}").read_text().splitlines() if "=" in line)
        envs.append(dict(pairs))
    assert [e["RANK"] for e in envs] == [str(r) for r in range(6)]
    assert {e["WORLD_SIZE"] for e in envs} == {"6"} and [e["LOCAL_RANK"] for e in envs] == ["0", "1"] * 3
    ports = {(e["MASTER_PORT"], e["BENCH_WRAPPER_PORT"], e["BENCH_STORE_PORT"]) for e in envs}
    assert len(ports) == 1 and len(next(iter(ports))) == len(set(next(iter(ports))))  # one job, three ports
    assert {e["TORCH_CPP_LOG_LEVEL"] for e in envs} == {"error"}  # NVRx's advice for its store polling
    argv = (tmp_path / "run.argv.0").read_text().split()
    assert argv[argv.index("--flavour") + 1] == "nvrx-inprocess" and argv[argv.index("--active-world") + 1] == "4"
    assert argv[argv.index("--gloo-timeout-s") + 1] == "10.0"  # NVRx's examples' gloo timeout on CPU
    pids = [int((run_dir / "pids" / f"rank-{r}").read_text()) for r in (2, 3)]
    assert launch.victims() == pids


def test_a_runs_detached_helpers_are_found_by_its_directory_and_ended(tmp_path):
    run_dir = tmp_path / "run"
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    mine = subprocess.Popen([*sleeper, str(run_dir)], start_new_session=True)
    other = subprocess.Popen([*sleeper, f"{run_dir}-10"], start_new_session=True)  # another run's, not ours
    try:
        deadline = time.monotonic() + 30
        while mine.pid not in pids_naming(str(run_dir)):
            assert time.monotonic() < deadline, "the helper never showed up in /proc"
            time.sleep(0.05)
        assert other.pid not in pids_naming(str(run_dir))
        Launch(strays=lambda: pids_naming(str(run_dir))).stop(timeout_s=1, strays_grace_s=0.2)
        assert mine.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for p in (mine, other):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
