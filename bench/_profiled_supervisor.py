"""`ftsup supervisor` under cProfile, switched on and off by signals (for `bench scale --profile`).

SIGUSR1 starts profiling the event-loop thread, SIGUSR2 stops it and writes the stats to the
file named by FTSUP_PROFILE_OUT, so only the measured window is profiled (not start-up or connect).
SIGHUP cuts the profile there: what was profiled so far goes to FTSUP_PROFILE_OUT and profiling
goes on into the file FTSUP_PROFILE_TAIL_OUT names (the bench cuts at the silence: training
alone, then the failure's tail). With FTSUP_PROFILE_CONNECT_OUT the first part goes there instead
and FTSUP_PROFILE_OUT follows it (the bench starts the leader's profile as the fleet connects and
cuts at the window's start: registration and the generation's start, then the window); a SIGHUP
while not profiling skips the part (a shard, not profiled while connecting, starts at the window).
FTSUP_PROFILE_CLOCK=cpu times functions by this process's CPU time instead of wall time (the idle
poll and the waits for a busy machine's cores then count nothing).
Not a benchmark itself (the leading underscore keeps it out of `ftsup bench --help`).
"""

from __future__ import annotations

import cProfile
import os
import signal
import sys
import time
from collections.abc import Callable

from ftsup.supervisor.main import main

_CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time}


def _install(out_path: str, tail_path: str | None, connect_path: str | None = None, clock: str = "wall") -> None:
    def new_profile() -> cProfile.Profile:
        return cProfile.Profile(_CLOCKS[clock]) if clock != "wall" else cProfile.Profile()

    profiler = new_profile()
    paths = [*([connect_path] if connect_path else []), out_path, tail_path or out_path]

    running = False

    def start(*_: object) -> None:
        nonlocal running
        profiler.enable()
        running = True

    def stop(*_: object) -> None:
        nonlocal running
        profiler.disable()
        running = False
        profiler.dump_stats(paths[0])

    def cut(*_: object) -> None:
        """The next part starts now: this one's profile is written (a part never started, as a
        shard's connect, is skipped: no file)."""
        nonlocal profiler
        if running:
            stop()
        if len(paths) > 1:
            paths.pop(0)
        profiler = new_profile()
        start()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    signal.signal(signal.SIGHUP, cut)


if __name__ == "__main__":
    _install(os.environ["FTSUP_PROFILE_OUT"], os.environ.get("FTSUP_PROFILE_TAIL_OUT"),
             os.environ.get("FTSUP_PROFILE_CONNECT_OUT"), os.environ.get("FTSUP_PROFILE_CLOCK", "wall"))
    sys.exit(main(sys.argv[1:]))
