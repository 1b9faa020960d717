"""SIGTERM and SIGHUP stop a harness command the way Ctrl-C does: by unwinding, so its cleanup runs.

Python's default action for SIGTERM and SIGHUP ends the process at once, skipping every `finally`
and `__exit__`: a bench, chaos run or demo stopped by a script, a CI timeout or a closed terminal
left its supervisors, agents, ranks and private etcd members running (each child sits in its own
session, so no signal reaches them unless their parent passes it on). Here the first of those
signals raises `Stopped` (a KeyboardInterrupt, so every `except KeyboardInterrupt` that stops a
cluster on Ctrl-C does the same on SIGTERM) in the main thread; repeats while that cleanup runs
are ignored, so the cleanup runs once and to its end (SIGKILL still ends it at once). The daemons
(`ftsup supervisor`, `ftsup agent`) have their own graceful shutdown and are not wrapped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A stop signal arrived: unwind as for Ctrl-C. `signum` says which (exit 128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process a signal ended


@contextlib.contextmanager
def unwinding_on_stop_signals() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise `Stopped` once; the previous handlers come back after.

    Outside the main thread (a test calling a command's main in a worker) nothing is installed:
    Python delivers signals to the main thread only.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    is_stopping = False

    def on_stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal is_stopping
        if is_stopping:
            # os.write, not print: a handler may run in the middle of a print to the same stream.
            os.write(2, f"already stopping ({signal.Signals(signum).name} ignored); SIGKILL abandons the"
                        " cleanup and leaves its processes running\n".encode())
            return
        is_stopping = True
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, on_stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # None: not set from Python


def default_stop_actions() -> None:
    """For a process forked (not exec'd) inside the block, e.g. a multiprocessing worker: SIGTERM
    and SIGHUP end it at once again, as its parent expects of `terminate()`; the parent, not the
    worker, owns the cleanup."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
