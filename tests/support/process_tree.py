"""A process's descendants read from /proc, for tests that check nothing a command started outlives it.

Each process is named by pid and start time (field 22 of /proc/PID/stat), so a pid the kernel
reuses after one of them is gone is never taken for it.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    start_ticks: int
    argv: tuple[str, ...]

    @property
    def is_running(self) -> bool:
        """Still this process and not a zombie (a zombie has ended; only its parent's wait is due)."""
        stat = _stat(self.pid)
        return stat is not None and stat[2] == self.start_ticks and stat[1] != "Z"


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start ticks) of `pid`, or None when it is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0], int(fields[19])


def _argv(pid: int) -> tuple[str, ...]:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def descendants(root: int) -> dict[int, Proc]:
    """Every live process below `root` (children, their children, ...), by pid."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            children.setdefault(stat[0], []).append(int(name))
    found: dict[int, Proc] = {}
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            stat = _stat(pid)
            if stat is not None and stat[1] != "Z":
                found[pid] = Proc(pid, stat[2], _argv(pid))
            todo.append(pid)
    return found
