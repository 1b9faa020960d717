"""The embedded event log on a real file: durable appends, torn tails, corruption, follow."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from supervisor.core.events import NodeCleared, SnapshotCommitted
from supervisor.eventlog.api import LogCorrupt
from supervisor.eventlog.embedded import EmbeddedLog
from supervisor.eventlog.memory import MemoryLog


async def test_appended_records_survive_reopen_with_gapless_seqs(tmp_path: pathlib.Path):
    log = EmbeddedLog(tmp_path)
    first = await log.append([NodeCleared("a", "x"), SnapshotCommitted(1, 2)], term=0, time_unix_s=10.0)
    second = await log.append([NodeCleared("b", "y")], term=0, time_unix_s=11.0)
    log.close()
    assert [r.seq for r in first + second] == [1, 2, 3]
    reopened = EmbeddedLog(tmp_path)
    assert list(reopened.read()) == first + second
    assert [r.seq for r in reopened.read(3)] == [3]
    assert reopened.truncated_bytes == 0


async def test_a_torn_tail_is_truncated_and_reported_and_appends_continue(tmp_path: pathlib.Path):
    log = EmbeddedLog(tmp_path)
    await log.append([NodeCleared("a", "x")], term=0, time_unix_s=1.0)
    log.close()
    size = log.path.stat().st_size
    with open(log.path, "ab") as handle:
        handle.write(b"\x40\x00\x00\x00\x01\x02")  # a frame header whose body never landed
    reopened = EmbeddedLog(tmp_path)
    assert reopened.truncated_bytes == 6 and reopened.path.stat().st_size == size
    appended = await reopened.append([NodeCleared("b", "y")], term=0, time_unix_s=2.0)
    assert appended[0].seq == 2
    reopened.close()
    assert [r.seq for r in EmbeddedLog(tmp_path).read()] == [1, 2]


async def test_corruption_before_the_tail_is_an_error_naming_file_and_offset(tmp_path: pathlib.Path):
    log = EmbeddedLog(tmp_path)
    for i in range(3):
        await log.append([NodeCleared(f"n{i}", "reason long enough to matter")], term=0, time_unix_s=1.0)
    log.close()
    data = bytearray(log.path.read_bytes())
    data[12] ^= 0xFF  # inside the first record's payload
    log.path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt, match=r"events.log: bad record frame at byte offset 0"):
        EmbeddedLog(tmp_path)


@pytest.mark.parametrize("make_log", [lambda p: EmbeddedLog(p), lambda p: MemoryLog()], ids=["embedded", "memory"])
async def test_follow_yields_existing_then_new_records(tmp_path: pathlib.Path, make_log):
    log = make_log(tmp_path)
    await log.append([NodeCleared("a", "x")], term=0, time_unix_s=1.0)
    seen: list[int] = []

    async def reader() -> None:
        async for record in log.follow(1):
            seen.append(record.seq)
            if record.seq == 3:
                return

    task = asyncio.create_task(reader())
    await log.append([NodeCleared("b", "y"), NodeCleared("c", "z")], term=0, time_unix_s=2.0)
    await asyncio.wait_for(task, timeout=5)
    assert seen == [1, 2, 3]
    log.close()
