"""The embedded log on real files: reopen, torn tails, corruption, segments, snapshots, locks."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from ftsup.supervisor.core.events import NodeCleared
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.api import LogCorrupt, LogFormatError, LogLocked
from ftsup.supervisor.eventlog.embedded import SEGMENT_HEADER, EmbeddedLog


def cleared(i: int) -> NodeCleared:
    return NodeCleared(f"node-{i}", "a reason long enough to fill a few bytes")


async def filled(directory: pathlib.Path, count: int, segment_bytes: int = 4096) -> EmbeddedLog:
    log = EmbeddedLog(directory, segment_bytes=segment_bytes)
    for i in range(count):
        await log.append([cleared(i)], term=1, time_unix_s=float(i))
    return log


async def test_records_survive_reopen_across_segments(tmp_path: pathlib.Path):
    log = await filled(tmp_path, 200)
    written = list(log.read())
    assert len(log.segments) > 3, "small segments must roll"
    log.close()
    reopened = EmbeddedLog(tmp_path, segment_bytes=4096)
    assert reopened.head_seq == 200 and reopened.truncated_bytes == 0
    assert list(reopened.read()) == written
    assert [r.seq for r in reopened.read(150)] == list(range(150, 201))
    await reopened.append([cleared(999)], term=2, time_unix_s=1.0)
    assert reopened.head_seq == 201


async def test_a_torn_tail_is_truncated_reported_and_appends_continue(tmp_path: pathlib.Path):
    log = await filled(tmp_path, 5)
    last = log.segments[-1].path
    log.close()
    size = last.stat().st_size
    with open(last, "ab") as handle:
        handle.write(b"\x40\x00\x00\x00\x01\x02\x03")  # a frame whose body never reached the disk
    reopened = EmbeddedLog(tmp_path)
    assert reopened.truncated_bytes == 7 and reopened.truncated_segment == last
    assert last.stat().st_size == size
    assert (await reopened.append([cleared(5)], term=1, time_unix_s=0.0))[0].seq == 6
    reopened.close()
    assert [r.seq for r in EmbeddedLog(tmp_path).read()] == [1, 2, 3, 4, 5, 6]


async def test_a_bad_frame_followed_by_good_ones_is_corruption_naming_segment_and_offset(tmp_path: pathlib.Path):
    log = await filled(tmp_path, 5, segment_bytes=1 << 20)
    segment = log.segments[-1].path
    log.close()
    data = bytearray(segment.read_bytes())
    data[SEGMENT_HEADER.size + 12] ^= 0xFF  # inside the first record's payload
    segment.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt, match=rf"{segment.name}: CRC-32C mismatch at byte offset {SEGMENT_HEADER.size}"):
        EmbeddedLog(tmp_path)


async def test_damage_in_an_older_segment_is_never_truncated(tmp_path: pathlib.Path):
    log = await filled(tmp_path, 100)
    first = log.segments[0].path
    log.close()
    data = first.read_bytes()
    first.write_bytes(data[:-3])  # its last record lost bytes: not a tail, newer segments follow
    with pytest.raises(LogCorrupt, match=first.name):
        EmbeddedLog(tmp_path)
    assert first.stat().st_size == len(data) - 3, "nothing may be cut from a non-final segment"


async def test_compaction_needs_a_snapshot_and_keeps_the_fallback(tmp_path: pathlib.Path):
    log = await filled(tmp_path, 200)
    assert await log.compact() == 0  # no snapshot: nothing may go
    await log.save_snapshot(dataclasses.replace(ClusterState(), applied_seq=80))
    await log.save_snapshot(dataclasses.replace(ClusterState(), applied_seq=160))
    removed = await log.compact()
    assert 0 < removed <= 80 and log.first_seq <= 81
    log.close()
    reopened = EmbeddedLog(tmp_path, segment_bytes=4096)
    snapshot = reopened.load_snapshot()
    assert snapshot is not None and snapshot.applied_seq == 160
    assert [r.seq for r in reopened.read(161)] == list(range(161, 201))


async def test_a_truncated_newest_snapshot_falls_back_to_the_older_one(tmp_path: pathlib.Path):
    log = await filled(tmp_path, 50)
    await log.save_snapshot(dataclasses.replace(ClusterState(), applied_seq=20))
    await log.save_snapshot(dataclasses.replace(ClusterState(), applied_seq=40))
    log.close()
    newest = sorted((tmp_path / "snapshots").glob("*.snap"))[-1]
    newest.write_bytes(newest.read_bytes()[:-5])
    reopened = EmbeddedLog(tmp_path)
    snapshot = reopened.load_snapshot()
    assert snapshot is not None and snapshot.applied_seq == 20
    assert any("truncated" in w for w in reopened.snapshot_warnings)
    assert [r.seq for r in reopened.read(21)][:1] == [21]


async def test_a_second_opener_is_refused_while_the_first_holds_the_lock(tmp_path: pathlib.Path):
    log = await filled(tmp_path, 1)
    with pytest.raises(LogLocked, match="in use by another process"):
        EmbeddedLog(tmp_path)
    log.close()
    EmbeddedLog(tmp_path).close()  # released on close


def test_a_newer_format_or_the_old_single_file_log_is_refused(tmp_path: pathlib.Path):
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "FORMAT").write_text("ftsup-eventlog 2\n")
    with pytest.raises(LogFormatError, match="format 2 was written by a newer ftsup"):
        EmbeddedLog(newer)
    old = tmp_path / "old"
    old.mkdir()
    (old / "events.log").write_bytes(b"\x00" * 16)
    with pytest.raises(LogFormatError, match="ftsup 0.1 single-file log"):
        EmbeddedLog(old)


@pytest.mark.parametrize("zeros", [8, 4096])
async def test_a_zero_filled_tail_is_a_torn_tail_not_empty_records(tmp_path: pathlib.Path, zeros: int):
    log = await filled(tmp_path, 5)
    last = log.segments[-1].path
    log.close()
    with open(last, "ab") as handle:
        handle.write(bytes(zeros))  # CRC-32C of nothing is 0: zeros must not read as empty frames
    reopened = EmbeddedLog(tmp_path)
    assert reopened.truncated_bytes == zeros and reopened.head_seq == 5
