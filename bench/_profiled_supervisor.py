"""`ftsup supervisor` under cProfile, switched on and off by signals (for `bench scale --profile`).

SIGUSR1 starts profiling the event-loop thread, SIGUSR2 stops it and writes the stats to the
file named by FTSUP_PROFILE_OUT, so only the steady window is profiled (not start-up or connect).
Not a benchmark itself (the leading underscore keeps it out of `ftsup bench --help`).
"""

from __future__ import annotations

import cProfile
import os
import signal
import sys

from ftsup.supervisor.main import main


def _install(out_path: str) -> None:
    profiler = cProfile.Profile()

    def start(*_: object) -> None:
        profiler.enable()

    def stop(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(out_path)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


if __name__ == "__main__":
    _install(os.environ["FTSUP_PROFILE_OUT"])
    sys.exit(main(sys.argv[1:]))
