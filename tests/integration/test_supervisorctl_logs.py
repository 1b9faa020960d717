"""`supervisorctl logs` against a real local cluster: the supervisor relays a rank's output from
the agent that runs it, the backlog and then (--follow) what the rank prints later, and the
follow ends by itself when the rank's process exits."""

from __future__ import annotations

import json
import pathlib
import queue
import subprocess
import sys
import threading

import pytest

from ftsup.harness import orphan_guard
from ftsup.harness.cluster import ClusterSpec, LocalCluster, terminate_group, wait_until

pytestmark = pytest.mark.integration

SCRIPT = pathlib.Path(__file__).parents[1] / "support" / "chatty_rank.py"


def ctl(address: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "ftsup.supervisor.ctl.main", "--address", address, *args]


def test_logs_shows_a_ranks_output_and_follow_shows_what_it_prints_later(tmp_path: pathlib.Path) -> None:
    go = tmp_path / "go"
    spec = ClusterSpec(nodes=2, spares=0, ranks_per_node=1, trainer_argv=(sys.executable, str(SCRIPT), str(go)))
    with LocalCluster(spec, tmp_path / "cluster") as cluster:
        cluster.start()

        def backlog() -> dict | None:
            done = subprocess.run(ctl(cluster.address, "logs", "--rank", "1", "--json"),
                                  capture_output=True, text=True, timeout=60, check=False)
            answer = json.loads(done.stdout) if done.returncode == 0 else None
            return answer if answer and "hello from rank 1" in answer["lines"] else None

        answer = wait_until(backlog, 60, "rank 1's first line through supervisorctl logs", poll_s=0.5)
        assert answer["node_id"] == "node-2" and answer["generation"] == 1
        assert not any("rank 0" in line for line in answer["lines"])

        missing = subprocess.run(ctl(cluster.address, "logs", "--rank", "7"), capture_output=True, text=True,
                                 timeout=60, check=False)
        assert missing.returncode == 2 and "no rank 7" in missing.stderr

        follow = subprocess.Popen(ctl(cluster.address, "logs", "--rank", "1", "--follow"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        orphan_guard.watch(follow)  # stopped even if pytest itself is killed
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in follow.stdout], daemon=True)
        reader.start()
        try:
            assert lines.get(timeout=60) == "hello from rank 1"
            go.touch()  # only now does the rank print its second line
            assert lines.get(timeout=60) == "later line from rank 1"
            follow.wait(timeout=60)  # the rank exited: the follow ends without being cancelled
            assert follow.returncode == 0
            assert "has exited" in follow.stderr.read()
        finally:
            if follow.poll() is None:
                terminate_group(follow)
