"""The soak's resource sampling reads /proc: a process that exits between the caller's poll and the
read (gone, or a zombie without a VmRSS line) is left out of the sample instead of failing it."""

from __future__ import annotations

import os
import subprocess
import sys

from ftsup.harness.chaos.soak import proc_usage


def test_a_live_process_has_figures_and_a_zombie_or_a_reaped_one_has_none():
    rss, fds, threads = proc_usage(os.getpid()) or (0, 0, 0)
    assert rss > 0 and fds > 0 and threads >= 1
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert proc_usage(child.pid) is None
    child.wait()
    assert proc_usage(child.pid) is None
