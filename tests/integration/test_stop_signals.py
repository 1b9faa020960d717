"""A harness command stopped by SIGTERM stops everything it started (issue 16).

`ftsup bench scale` with two supervisor replicas on its own 3-member etcd, at the smallest size
its flags allow, is started as a script would start it, and SIGTERMed once its etcd members run
(it may still be starting the rest) or once its supervisors, etcd members and load process all
run (found below it in /proc). Python's default SIGTERM action skipped the bench's `finally` and
left all six running; now it unwinds as Ctrl-C does.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from ftsup.harness.cluster import wait_until
from tests.support.process_tree import Proc, descendants

pytestmark = pytest.mark.integration

BENCH = ["bench", "scale", "--nodes", "1", "--procs", "1", "--ranks-per-node", "1", "--intervals", "1",
         "--duration-s", "1", "--step-s", "1", "--sweep", "", "--replicas", "2", "--connect-timeout-s", "60"]


def kinds(tree: dict[int, Proc]) -> dict[str, int]:
    """How many etcd members, supervisors and load processes run in `tree`."""
    counts = {"etcd": 0, "supervisor": 0, "load": 0}
    for proc in tree.values():
        if proc.argv and pathlib.Path(proc.argv[0]).name == "etcd":
            counts["etcd"] += 1
        elif "ftsup.supervisor" in proc.argv:
            counts["supervisor"] += 1
        elif "ftsup.harness.fleet_load" in proc.argv:
            counts["load"] += 1
    return counts


# When to stop it: while it starts (its etcd members up, its supervisors maybe not yet), and with
# every kind of process it starts running.
STOP_WHEN = {
    "etcd_up": lambda counts: counts["etcd"] == 3,
    "all_up": lambda counts: counts == {"etcd": 3, "supervisor": 2, "load": 1},
}


@pytest.mark.parametrize("stop_when", sorted(STOP_WHEN))
def test_a_sigtermed_scale_bench_stops_its_supervisors_etcd_and_load_processes(tmp_path: pathlib.Path,
                                                                               stop_when: str) -> None:
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "TMPDIR": str(tmp_path)}
    with open(tmp_path / "stderr.txt", "wb") as err:
        bench = subprocess.Popen([sys.executable, "-m", "ftsup.harness.cli", *BENCH], stdout=subprocess.DEVNULL,
                                 stderr=err, env=env, start_new_session=True)
    started: dict[int, Proc] = {}
    try:
        def up() -> bool:
            assert bench.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
            started.update(descendants(bench.pid))
            return bool(STOP_WHEN[stop_when](kinds(descendants(bench.pid))))

        wait_until(up, 120, f"the bench's processes ({stop_when})", poll_s=0.1)
        started.update(descendants(bench.pid))
        signalled_at = time.monotonic()
        bench.send_signal(signal.SIGTERM)
        code = bench.wait(timeout=90)
        print(f"cleanup after SIGTERM took {time.monotonic() - signalled_at:.1f}s")
        # The bench waits for what it stops: by its exit every process it started has ended.
        still = [p for p in started.values() if p.is_running]
        assert not still, f"left running after the bench exited: {[(p.pid, p.argv[:4]) for p in still]}"
        stderr = (tmp_path / "stderr.txt").read_text()
        assert code == 128 + signal.SIGTERM, stderr[-3000:]
        assert "stopped by SIGTERM" in stderr
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for proc in started.values():  # only what this test's bench started, each checked by start time
            if proc.is_running:
                os.kill(proc.pid, signal.SIGKILL)
