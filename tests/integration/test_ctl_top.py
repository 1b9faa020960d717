"""supervisorctl top and goodput --plot against a real local cluster with a node killed.

One cluster serves three checks: `top --once` (text and --json) shows the dead node in its failure
domain and ends with the newest event; `goodput --plot` draws the interruption from the event
log; and, where tmux is installed, the live view runs in a real terminal and `q` gives it back.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from ftsup.harness.cluster import ClusterSpec, LocalCluster, wait_until
from ftsup.harness.demo import trainer_argv
from ftsup.supervisor.ctl import top_view
from ftsup.v1 import operator_pb2, state_pb2
from tests.support.png import png_size

pytestmark = pytest.mark.integration

CTL = [sys.executable, "-m", "ftsup.supervisor.ctl.main"]


def ctl(address: str, *args: str, columns: int = 100, lines: int = 40) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "LINES": str(lines), "GRPC_VERBOSITY": "ERROR"}
    return subprocess.run([*CTL, "--address", address, *args], capture_output=True, text=True, timeout=60, env=env)


def test_top_shows_a_killed_node_and_the_last_event_and_goodput_plots_the_interruption(tmp_path: pathlib.Path) -> None:
    slow = ("--slow-rank", "0", "--slow-ms", "100", "--slow-generation", "99")  # keeps the job running
    spec = ClusterSpec(nodes=2, spares=1, ranks_per_node=1, trainer_argv=trainer_argv(sys.executable, 400, seed=3) + slow,
                       heartbeat_interval_s=0.5, reconnect_grace_s=1.0, agent_args=("--failure-domain", "rack-7"))
    with LocalCluster(spec, tmp_path / "cluster") as cluster:
        cluster.start()
        cluster.wait_for(lambda: (s := cluster.status()).phase == operator_pb2.JOB_PHASE_RUNNING and s.step >= 2,
                         120, "the job to run")
        cluster.kill_node("node-2")
        cluster.wait_for(lambda: (s := cluster.status()).generation >= 2 and s.phase == operator_pb2.JOB_PHASE_RUNNING
                         and any(n.node_id == "node-2" and n.liveness == state_pb2.LIVENESS_DEAD for n in cluster.nodes()),
                         120, "generation 2 to run without node-2")

        frame = json.loads(ctl(cluster.address, "top", "--once", "--json").stdout)
        states = {node_id: state for group in frame["groups"] for node_id, state in group["nodes"]}
        assert states == {"node-1": "active", "node-2": "dead", "spare-1": "active"}
        assert [g["domain"] for g in frame["groups"]] == ["rack-7"]
        assert frame["counts"]["dead"] == 1 and frame["status"]["generation"] >= 2
        assert any(e["kind"] == "node_declared_dead" and e["node_id"] == "node-2" for e in frame["events"])

        done = ctl(cluster.address, "top", "--once")
        assert done.returncode == 0, done.stderr
        shown = done.stdout.splitlines()
        assert len(shown) <= 40 and all(len(line) <= 100 for line in shown)
        assert any("1 dead" in line for line in shown)
        assert any(line.startswith("rack-7 ") and "X" in line for line in shown)
        newest = [r for r in cluster.events() if r.event.WhichOneof("kind") not in top_view.QUIET_KINDS][-1]
        assert shown[-1].split()[0] == str(newest.seq) and newest.event.WhichOneof("kind") in shown[-1]

        plotted = ctl(cluster.address, "goodput", "--plot", str(tmp_path / "goodput.png"), "--json")
        assert plotted.returncode == 0, plotted.stderr
        series = json.loads(plotted.stdout)
        assert png_size(tmp_path / "goodput.png")[0] > 800
        assert [(i["generation"], i["reason"]) for i in series["interruptions"]] == [(1, "node_lost")]
        wall = series["t_s"][-1]
        assert sum(series["buckets_s"][b][-1] for b in series["buckets_s"]) == pytest.approx(wall, rel=1e-6)
        assert series["buckets_s"]["detection"][-1] > 0  # the dead node was silent before its verdict

        if shutil.which("tmux"):
            _check_live_view_in_tmux(cluster.address, tmp_path)


def _check_live_view_in_tmux(address: str, tmp_path: pathlib.Path) -> None:
    """The live view draws in a real 90x30 terminal, redraws, and `q` leaves the alternate screen."""
    socket = f"ftsup-top-{os.getpid()}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    script = tmp_path / "top.sh"
    script.write_text(f"{' '.join(CTL)} --address {address} top --interval 0.5; echo TOP-EXITED-$?; sleep 60\n")
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "TERM": "xterm-256color"}
    subprocess.run([*tmux, "new-session", "-d", "-s", "top", "-x", "90", "-y", "30", f"sh {script}"], check=True,
                   env=env, timeout=20)
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True,
                                  timeout=10).stdout

        def showing(*needles: str) -> str | None:
            text = screen()
            return text if all(n in text for n in needles) else None

        first = wait_until(lambda: showing("ftsup top", "events"), 30, "top to draw in tmux")
        assert all(len(line) <= 90 for line in first.splitlines())
        clock = next(line for line in first.splitlines() if line.startswith("ftsup top")).split()[-2]
        wait_until(lambda: clock not in screen().splitlines()[0] or None, 10, "top to redraw (its clock to move)")
        subprocess.run([*tmux, "send-keys", "-t", "top", "q"], check=True, timeout=10)
        after = wait_until(lambda: showing("TOP-EXITED-"), 15, "top to exit on q")
        assert "TOP-EXITED-0" in after and "ftsup top" not in after  # the shell's screen is back
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)
