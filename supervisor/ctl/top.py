"""`supervisorctl top`: a live terminal view of the job for people on a shell.

Each frame asks the Operator service for the status, the nodes and the event records appended
since the last frame (ListEvents from the next seq, so the log is read once, not per frame), then
draws with plain ANSI: home the cursor, overwrite each line, clear what is left. The alternate
screen keeps the shell's scrollback intact; `q` or Ctrl-C leaves and restores the terminal.
`--once` prints one frame and exits (`--json`: the frame's data). Drawing is in top_view.py (pure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, TextIO

import grpc

from ftsup.supervisor.ctl import top_view
from ftsup.v1 import events_pb2, operator_pb2, operator_pb2_grpc

EXIT_OK = 0
EXIT_USAGE = 2
EVENT_WINDOW = 500  # records kept (quiet kinds included); the first frame reads back this far
Stub = operator_pb2_grpc.OperatorStub


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Registers `top` on supervisorctl's parser (main.py calls this: one line there)."""
    top = sub.add_parser("top", parents=[common],
                         help="live view: node states by failure domain, generation, step rate, loss, ETTR, events")
    top.add_argument("--once", action="store_true", help="print one frame and exit (with --json: its data)")
    top.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between frames (default 1)")


class Collector:
    """The replies one frame needs, and what is kept between frames (event tail, step samples)."""

    def __init__(self, stub: Stub, timeout_s: float) -> None:
        self.stub = stub
        self.timeout_s = timeout_s
        self.records: deque[events_pb2.Record] = deque(maxlen=EVENT_WINDOW)
        self.next_seq = 0  # 0: not read yet
        self.rate = top_view.StepRate()

    def frame(self) -> dict[str, Any]:
        status = self.stub.GetStatus(operator_pb2.GetStatusRequest(), timeout=self.timeout_s)
        nodes = self.stub.ListNodes(operator_pb2.ListNodesRequest(), timeout=self.timeout_s).nodes
        if self.next_seq == 0 or self.next_seq < status.first_seq:
            self.next_seq = max(status.first_seq, status.head_seq - EVENT_WINDOW + 1, 1)
        if status.head_seq >= self.next_seq:
            request = operator_pb2.ListEventsRequest(since_seq=self.next_seq, follow=False)
            for record in self.stub.ListEvents(request, timeout=self.timeout_s):
                self.records.append(record)
                self.next_seq = record.seq + 1
        now = time.time()
        self.rate.add(top_view.Sample(now, status.generation, status.step))
        rate = self.rate.rate(top_view.snapshot_samples(self.records))
        return top_view.frame(status, nodes, list(self.records), rate, now)


def _colour(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def cmd_top(stub: Stub, args: argparse.Namespace) -> int:
    if args.json and not args.once:
        print("supervisorctl top: --json prints one frame's data: add --once", file=sys.stderr)
        return EXIT_USAGE
    if not 0.1 <= args.interval <= 3600:
        print(f"supervisorctl top: --interval must be within [0.1, 3600] seconds, got {args.interval:g}", file=sys.stderr)
        return EXIT_USAGE
    collector = Collector(stub, args.timeout)
    if args.once:
        data = collector.frame()  # an RpcError goes to main.py's mapping (exit 3 when unreachable)
        if args.json:
            print(json.dumps(data), flush=True)
        else:
            size = shutil.get_terminal_size()
            print("\n".join(top_view.lines(data, size.columns, size.lines, _colour(sys.stdout))), flush=True)
        return EXIT_OK
    return _live(collector, args.interval, sys.stdout, sys.stdin)


def _live(collector: Collector, interval_s: float, out: TextIO, keys: TextIO) -> int:
    """Redraws every interval until `q` or Ctrl-C; an unreachable supervisor is shown, not fatal."""
    colour = _colour(out)
    last: dict[str, Any] | None = None
    with _screen(out), _cbreak(keys) as readable:
        try:
            while True:
                size = shutil.get_terminal_size()
                problem = ""
                try:
                    last = collector.frame()
                except grpc.RpcError as error:
                    code = error.code().name if hasattr(error, "code") else "error"
                    problem = f"supervisor unreachable ({code}); retrying every {interval_s:g}s"
                shown = top_view.lines(last, size.columns, size.lines - (1 if problem else 0), colour) if last else []
                if problem:
                    shown = [problem[:size.columns], *shown]
                out.write("\x1b[H" + "".join(f"{line}\x1b[K\r\n" for line in shown[:-1]) +
                          (shown[-1] + "\x1b[K" if shown else "") + "\x1b[J")
                out.flush()
                if _quit_pressed(keys if readable else None, interval_s):
                    return EXIT_OK
        except KeyboardInterrupt:
            return EXIT_OK


def _quit_pressed(keys: TextIO | None, wait_s: float) -> bool:
    """Waits up to `wait_s` for a key; True when it is q (other keys redraw at once)."""
    if keys is None:
        time.sleep(wait_s)
        return False
    ready, _, _ = select.select([keys], [], [], wait_s)
    if not ready:
        return False
    typed = os.read(keys.fileno(), 64).decode(errors="replace")
    return "q" in typed.lower()


@contextlib.contextmanager
def _screen(out: TextIO) -> Iterator[None]:
    """The alternate screen with the cursor hidden, given back on any exit."""
    out.write("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J")
    out.flush()
    try:
        yield
    finally:
        out.write("\x1b[0m\x1b[?25h\x1b[?1049l")
        out.flush()


@contextlib.contextmanager
def _cbreak(keys: TextIO) -> Iterator[bool]:
    """Keys without Enter (and unechoed) while top runs; yields whether keys can be read at all."""
    if not keys.isatty():
        yield False
        return
    import termios
    import tty

    fd = keys.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
