"""A harness command stopped by SIGTERM stops everything it started; SIGKILLed, its guard does (issue 16).

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
from collections.abc import Callable
from typing import Any

import pytest

from ftsup.harness.cluster import wait_until
from ftsup.harness.stop_signals import Stopped
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


def _start_bench(tmp_path: pathlib.Path) -> subprocess.Popen[bytes]:
    """The bench, started as a script would start it (its stderr kept for the failure message)."""
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "TMPDIR": str(tmp_path)}
    with open(tmp_path / "stderr.txt", "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "ftsup.harness.cli", *BENCH], stdout=subprocess.DEVNULL,
                                stderr=err, env=env, start_new_session=True)


def _wait_for_processes(bench: subprocess.Popen[bytes], tmp_path: pathlib.Path, stop_when: str,
                        started: dict[int, Proc]) -> None:
    """Until the bench runs what `stop_when` names; every process seen below it lands in `started`."""
    def up() -> bool:
        assert bench.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
        started.update(descendants(bench.pid))
        return bool(STOP_WHEN[stop_when](kinds(descendants(bench.pid))))

    wait_until(up, 120, f"the bench's processes ({stop_when})", poll_s=0.1)
    started.update(descendants(bench.pid))


@pytest.mark.parametrize("stop_when", sorted(STOP_WHEN))
def test_a_sigtermed_scale_bench_stops_its_supervisors_etcd_and_load_processes(tmp_path: pathlib.Path,
                                                                               stop_when: str) -> None:
    bench = _start_bench(tmp_path)
    started: dict[int, Proc] = {}
    try:
        _wait_for_processes(bench, tmp_path, stop_when, started)
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


def test_a_sigkilled_scale_bench_leaves_nothing_running(tmp_path: pathlib.Path) -> None:
    """SIGKILL runs no `finally`: the bench's guard process (harness/orphan_guard.py) stops its
    supervisors, etcd members and load process once the bench is gone. Before it, all six ran on."""
    bench = _start_bench(tmp_path)
    started: dict[int, Proc] = {}
    try:
        _wait_for_processes(bench, tmp_path, "all_up", started)
        killed_at = time.monotonic()
        bench.kill()
        bench.wait()
        ours = {pid: p for pid, p in started.items() if "orphan_guard" not in " ".join(p.argv)}
        wait_until(lambda: not [p for p in ours.values() if p.is_running], 30,
                   f"the guard to stop {sorted((p.pid, p.argv[:3]) for p in ours.values())}")
        print(f"everything stopped {time.monotonic() - killed_at:.1f}s after the SIGKILL")
    finally:
        for proc in started.values():  # only what this test's bench started, each checked by start time
            if proc.is_running:
                os.kill(proc.pid, signal.SIGKILL)


def _etcd(tmp_path: pathlib.Path) -> tuple[object, str, Callable[[], list[subprocess.Popen[bytes]]]]:
    from ftsup.harness.etcd_cluster import EtcdCluster

    cluster = EtcdCluster(tmp_path / "etcd")
    return cluster, "wait_healthy", lambda: [m.process for m in cluster.members if m.process is not None]


def _s3(tmp_path: pathlib.Path) -> tuple[object, str, Callable[[], list[subprocess.Popen[bytes]]]]:
    from ftsup.harness.s3_server import S3Server

    server = S3Server(tmp_path / "s3")
    return server, "_wait_ready", lambda: [server.process] if server.process is not None else []


def _browser(tmp_path: pathlib.Path) -> tuple[object, str, Callable[[], list[subprocess.Popen[bytes]]]]:
    from ftsup.harness.browser import Browser, find_chromium

    if find_chromium() is None:
        pytest.skip("chromium is not installed")
    browser = Browser()
    return browser, "call", lambda: [browser.process] if browser.process is not None else []


@pytest.mark.parametrize("make", [_etcd, _s3, _browser], ids=["etcd", "s3_server", "browser"])
def test_a_start_cut_short_by_a_stop_signal_kills_what_it_started(tmp_path: pathlib.Path, make) -> None:
    """`with X() as x:` runs X's __exit__ only once __enter__ returned: a SIGTERM while X waits for
    its process to be ready must not leave that process behind."""
    thing, waits_in, processes = make(tmp_path)
    seen: list[subprocess.Popen[bytes]] = []

    def stopped(*_args: Any, **_kwargs: Any) -> Any:
        seen.extend(processes())  # what the start spawned before it waited
        raise Stopped(signal.SIGTERM)

    setattr(thing, waits_in, stopped)
    try:
        with pytest.raises(Stopped), thing:  # type: ignore[attr-defined]
            pytest.fail("the start was stopped: the block never runs")
        assert seen, "the start spawned its process before it waited"
        assert all(p.poll() is not None for p in seen), "a process of the stopped start is still running"
    finally:
        for process in seen:  # this test's own children: none may outlive it, even when it fails
            if process.poll() is None:
                process.kill()
                process.wait()
