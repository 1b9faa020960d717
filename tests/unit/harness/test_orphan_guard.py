"""A harness process SIGKILLed leaves nothing it started running (harness/orphan_guard.py), and a
normal exit leaves its guard nothing to do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ftsup.harness import orphan_guard
from ftsup.harness.cluster import wait_until
from tests.support.process_tree import Proc, descendants

# A stand-in for `ftsup run`: starts a session leader with a child of its own (an agent and its
# rank), and a plain child, has the guard watch the two it started, prints their pids, waits.
HARNESS = textwrap.dedent("""
    import subprocess, sys, time
    from ftsup.harness.orphan_guard import watch
    leader = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; r = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        " print(r.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watch(leader)
    watch(plain)
    rank = leader.stdout.readline().strip()
    print(leader.pid, rank, plain.pid, flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)
    time.sleep(600)
""")


def _start(how: str) -> tuple[subprocess.Popen[str], list[Proc]]:
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, how], stdout=subprocess.PIPE, text=True)
    assert harness.stdout is not None
    pids = [int(p) for p in harness.stdout.readline().split()]
    assert len(pids) == 3, pids
    below = descendants(harness.pid)
    return harness, [below[pid] for pid in pids]


def _cleanup(procs: list[Proc]) -> None:
    for proc in procs:  # (only these: each one this test started, checked by start time)
        if proc.is_running:
            os.kill(proc.pid, signal.SIGKILL)


def test_a_sigkilled_harness_leaves_no_child_and_no_grandchild_running() -> None:
    harness, procs = _start("wait")
    try:
        assert all(p.is_running for p in procs)
        harness.kill()
        harness.wait()
        wait_until(lambda: not any(p.is_running for p in procs), 15,
                   f"the guard to stop the leader, its rank and the plain child {[p.pid for p in procs]}")
    finally:
        _cleanup(procs)


def test_a_harness_that_exits_normally_leaves_its_guard_nothing_to_stop() -> None:
    """Its own cleanup ran (here: it chose to leave its children): the guard says nothing."""
    harness, procs = _start("exit")
    try:
        assert harness.wait(timeout=30) == 0
        wait_until(lambda: not _guards_of(harness.pid), 10, "the guard to exit on goodbye")
        assert all(p.is_running for p in procs), "a goodbye must leave everything alone"
    finally:
        _cleanup(procs)


def _guards_of(parent: int) -> list[int]:
    """Pids of the guard processes started for `parent` (named by its pid on their command line)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    argv = cmdline.read().split(b"\0")
            except OSError:
                continue
            if b"ftsup.harness.orphan_guard" in argv and str(parent).encode() in argv:
                found.append(int(entry))
    return found


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_and_a_reused_pid_is_never_signalled() -> None:
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time, sys; signal.signal(signal.SIGTERM,"
                                 " signal.SIG_IGN); print(flush=True); time.sleep(600)"],
                                stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert stubborn.stdout is not None
        stubborn.stdout.readline()  # (its handler is in place)
        watched = orphan_guard.watched(stubborn.pid)
        assert watched is not None and watched.leads_group
        other = orphan_guard.Watched(os.getpid(), watched.started + 1, leads_group=False)  # "a reused pid"
        assert not other.is_running()
        other.send(signal.SIGKILL)  # must not reach this test's own process
        assert orphan_guard.stop_all([watched, other], grace_s=0.3) == [stubborn.pid]
        assert stubborn.wait(timeout=10) == -signal.SIGKILL
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()


@pytest.mark.parametrize("line", [b"not-a-pid\n", b"-1\n", b"99999999\n"])
def test_the_guard_ignores_lines_that_name_no_process_and_stops_on_a_goodbye(line: bytes) -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, line + orphan_guard.BYE.encode() + b"\n")
        with os.fdopen(read_end, "rb", closefd=False) as commands:
            assert orphan_guard.guard(commands, os.getppid()) == 0
    finally:
        os.close(read_end)
        os.close(write_end)
