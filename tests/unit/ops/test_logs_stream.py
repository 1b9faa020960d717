"""Log lines go to `sys.stderr` as it is when each is written: a bench run in-process under
pytest's capture configured logging on that test's (later closed) stream, and every later log call
in the process raised "I/O operation on closed file" (a restore task died on it and its trainer
waited forever)."""

from __future__ import annotations

import io
import sys

from ftsup.common import logs


def test_a_stream_swapped_and_closed_after_configure_breaks_no_later_log_line(monkeypatch) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.configure(json=True)
    log = logs.get("probe")
    log.info("before")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    log.info("after")  # raised ValueError when configure bound the stream it saw
    assert '"event": "after"' in second.getvalue()
