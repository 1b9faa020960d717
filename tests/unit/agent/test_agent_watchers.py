"""Hang limits (pure) and following a kernel-log file the way the Xid watcher does."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from ftsup.agent.core.hang import HangConfig, check_hang, hang_limit_s
from ftsup.agent.watchers import follow_file

CONFIG = HangConfig(multiple=10.0, floor_s=120.0, startup_s=600.0)


def test_before_the_first_step_only_the_startup_allowance_applies():
    assert hang_limit_s([], CONFIG) == 600.0
    assert check_hang([], last_progress_s=0.0, now=599.0, config=CONFIG) is None
    assert check_hang([], last_progress_s=0.0, now=601.0, config=CONFIG).limit_s == 600.0


def test_the_limit_is_a_multiple_of_the_median_step_but_never_below_the_floor():
    assert hang_limit_s([0.5] * 10, CONFIG) == 120.0
    assert hang_limit_s([30.0, 30.0, 300.0], CONFIG) == 300.0  # one slow step does not move the median
    hang = check_hang([30.0] * 5, last_progress_s=100.0, now=401.0, config=CONFIG)
    assert hang is not None and hang.silent_for_s == pytest.approx(301.0)


def test_absurd_limits_are_refused():
    with pytest.raises(ValueError):
        HangConfig(multiple=0.5)


async def test_following_a_file_yields_only_new_lines_and_survives_rotation(tmp_path: pathlib.Path):
    log = tmp_path / "kern.log"
    log.write_text("old line before the watcher\n")
    lines = follow_file(log, poll_s=0.01)
    seen: list[str] = []

    async def collect(count: int) -> None:
        async for line in lines:
            seen.append(line)
            if len(seen) == count:
                return

    task = asyncio.create_task(collect(3))
    with open(log, "a") as handle:  # before the task's first turn: still after the watcher started
        handle.write("first\nsecond")
    await asyncio.sleep(0.05)  # (either order of the watcher's poll and the next write must give the same lines)
    with open(log, "a") as handle:
        handle.write(" half\n")
    log.rename(tmp_path / "kern.log.1")  # rotation: a new file takes the name
    (tmp_path / "kern.log").write_text("after rotation\n")
    await asyncio.wait_for(task, timeout=5)
    assert seen == ["first", "second half", "after rotation"]
