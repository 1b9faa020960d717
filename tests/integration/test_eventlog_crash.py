"""The embedded log against real crashes and a real full disk, with real processes.

A writer appending under load is SIGKILLed at random moments, many times over the same
directory: after each, reopening loses no acknowledged record and shows none that was not fully
written. A writer that may not grow its files (RLIMIT_FSIZE) gets a clean LogUnavailable, and
everything it acknowledged before is still there.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

from ftsup.harness import orphan_guard
from ftsup.supervisor.eventlog.embedded import EmbeddedLog
from tests.support.log_writer import event

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
KILLS = 25


def start_writer(directory: pathlib.Path, *extra: str) -> subprocess.Popen[str]:
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.log_writer", str(directory), *extra],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )
    orphan_guard.watch(writer)  # stopped even if pytest itself is killed
    return writer


def check_acknowledged(directory: pathlib.Path, acks: list[tuple[int, int, int, int]]) -> int:
    log = EmbeddedLog(directory, segment_bytes=64 * 1024)
    try:
        records = {r.seq: r for r in log.read()}
        assert sorted(records) == list(range(1, log.head_seq + 1)), "seqs must be gapless"
        for first, last, task, batch in acks:
            for index, seq in enumerate(range(first, last + 1)):
                assert seq in records, f"acknowledged seq {seq} lost"
                assert records[seq].event == event(task, batch, index), f"seq {seq} holds other data"
        return log.head_seq
    finally:
        log.close()


def test_sigkill_at_random_moments_never_loses_an_acknowledged_record(tmp_path: pathlib.Path) -> None:
    rng = random.Random(20261121)
    acks: list[tuple[int, int, int, int]] = []
    head = 0
    truncations = 0
    for _ in range(KILLS):
        writer = start_writer(tmp_path)
        assert writer.stdout is not None
        opened = writer.stdout.readline().split()
        assert opened[0] == "OPEN" and int(opened[1]) >= head
        truncations += int(opened[2]) > 0
        wanted = rng.randint(1, 40)
        deadline = time.monotonic() + 30
        seen = 0
        while seen < wanted and time.monotonic() < deadline:
            line = writer.stdout.readline().split()
            if line and line[0] == "ACK":
                acks.append(tuple(int(x) for x in line[1:]))  # type: ignore[arg-type]
                seen += 1
        os.kill(writer.pid, signal.SIGKILL)  # mid-append, most likely
        for line in writer.stdout:  # acknowledgements printed before the kill landed
            parts = line.split()
            if parts and parts[0] == "ACK":
                acks.append(tuple(int(x) for x in parts[1:]))  # type: ignore[arg-type]
        writer.wait(timeout=10)
        assert seen == wanted, "the writer stopped acknowledging"
        head = check_acknowledged(tmp_path, acks)
    assert head >= len(acks)


def test_a_full_disk_fails_appends_cleanly_and_keeps_what_was_acknowledged(tmp_path: pathlib.Path) -> None:
    writer = start_writer(tmp_path, "--fsize-limit", str(40 * 1024))
    out, _ = writer.communicate(timeout=60)
    lines = [(line.split(maxsplit=1) + [""])[:2] for line in out.splitlines()]
    assert any(kind == "UNAVAILABLE" and "File too large" in rest for kind, rest in lines if kind == "UNAVAILABLE")
    acks = [tuple(int(x) for x in rest.split()) for kind, rest in lines if kind == "ACK"]
    assert acks, "some appends must succeed before the limit"
    head = check_acknowledged(tmp_path, acks)  # type: ignore[arg-type]
    reopened = EmbeddedLog(tmp_path, segment_bytes=64 * 1024)
    assert reopened.truncated_bytes == 0, "a failed append must not leave a partial frame behind"
    reopened.close()
    assert head == max(last for _, last, _, _ in acks)
