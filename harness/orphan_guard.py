"""Stops what a harness command started when the command dies without cleaning up (issue 16).

A SIGKILLed `ftsup run`, `demo`, `chaos`, `bench` (or the OOM killer's victim) runs no `finally`:
its supervisors, agents, etcd members, S3 server and browser went on running, holding ports and
memory, until someone found them. PR_SET_PDEATHSIG would tie each child to its parent, but it
must be set between fork and exec (`preexec_fn`, unsafe in a process running gRPC threads) and
fires when the forking *thread* ends, not the process.

Instead, one small guard process per harness process: the harness tells it the pid of each
process it starts (`watch`), the guard notes the pid's start time (so a pid the kernel reuses
later is never signalled), and the guard waits for its parent to go. A parent that exits
normally says goodbye first (its own cleanup ran; the guard leaves everything alone); a parent
that dies without a word (the pipe's end closes, or the guard is re-parented) leaves the guard to
stop every watched process still running: SIGTERM to its process group (a child started with
`start_new_session` leads one: an agent and its ranks go together), SIGKILL after a grace.

Stdlib only and started with `python -I -m`, so it costs ~20 ms and a few MiB per harness process.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Protocol

GRACE_S = 5.0  # between SIGTERM and SIGKILL: an agent stops its ranks, a supervisor flushes its log
POLL_S = 0.5  # how often the guard checks that its parent lives (besides the pipe's end)
BYE = "bye"


class _HasPid(Protocol):
    pid: int


# -- the harness side ----------------------------------------------------------------------------

_lock = threading.Lock()
_guard: subprocess.Popen[bytes] | None = None
_guard_owner = 0  # the pid that started `_guard` (a forked child starts its own)


def watch(process: _HasPid) -> None:
    """Has the guard stop `process` (and its process group, if it leads one) should this process
    die without stopping it. Never raises: a guard that cannot start costs the protection only."""
    global _guard, _guard_owner
    with _lock:
        try:
            if _guard is None or _guard_owner != os.getpid() or _guard.poll() is not None:
                if _guard_owner == 0:
                    atexit.register(_say_goodbye)
                _guard = subprocess.Popen([sys.executable, "-I", "-m", "ftsup.harness.orphan_guard", str(os.getpid())],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True)
                _guard_owner = os.getpid()
            assert _guard.stdin is not None
            _guard.stdin.write(f"{process.pid}\n".encode())
            _guard.stdin.flush()
        except (OSError, ValueError):
            pass


def _say_goodbye() -> None:
    """At a normal exit: our own cleanup ran, so the guard must leave everything alone."""
    global _guard
    with _lock:
        guard, _guard = _guard, None
        if guard is None or _guard_owner != os.getpid():
            return
        try:
            assert guard.stdin is not None
            guard.stdin.write(f"{BYE}\n".encode())
            guard.stdin.close()
            guard.wait(timeout=5)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass


# -- the guard -------------------------------------------------------------------------------------

def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # (fields after the command: state is field 3, starttime field 22)
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Watched:
    pid: int
    started: int  # its start time: a pid reused by another process is not ours
    leads_group: bool  # started with start_new_session: its group is its own (an agent and its ranks)

    def is_running(self) -> bool:
        if start_time(self.pid) == self.started:
            return True
        if self.leads_group:  # the leader gone, members of its group may be left (a pgid is never reused while one lives)
            try:
                os.killpg(self.pid, 0)
                return True
            except OSError:
                return False
        return False

    def send(self, signum: int) -> None:
        try:
            if self.leads_group:
                os.killpg(self.pid, signum)
            elif start_time(self.pid) == self.started:
                os.kill(self.pid, signum)
        except OSError:
            pass


def watched(pid: int) -> Watched | None:
    started = start_time(pid)
    if started is None:
        return None
    try:
        leads_group = os.getpgid(pid) == pid
    except OSError:
        return None
    return Watched(pid, started, leads_group)


def stop_all(processes: list[Watched], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every watched process still running (its whole group if it leads one), then SIGKILL
    what is left after `grace_s`. Returns the pids signalled."""
    running = [w for w in processes if w.is_running()]
    for w in running:
        w.send(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(w.is_running() for w in running):
        time.sleep(0.05)
    for w in running:
        if w.is_running():
            w.send(signal.SIGKILL)
    return [w.pid for w in running]


def guard(commands: IO[bytes], parent: int) -> int:
    """Reads pids (one per line) until the parent says goodbye (return 0, nothing signalled) or
    goes without a word (stop every watched process; return 1)."""
    processes: dict[int, Watched] = {}
    buffered = b""
    fd = commands.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if not ready:
            if os.getppid() != parent:
                break  # re-parented: the harness died (whoever still holds the pipe)
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break  # EOF without a goodbye
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace").strip()
            if text == BYE:
                return 0
            if text.isdigit() and (found := watched(int(text))) is not None:
                processes[found.pid] = found
        if len(processes) > 256:  # (a long chaos run starts thousands: keep the living)
            processes = {pid: w for pid, w in processes.items() if w.is_running()}
    stop_all(list(processes.values()))
    return 1


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a Ctrl-C is the harness's to handle)
    parent = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else os.getppid()
    # (a parent that died while this started left what it wrote in the pipe: read, then stop it)
    return guard(sys.stdin.buffer, parent)


if __name__ == "__main__":
    sys.exit(main())
