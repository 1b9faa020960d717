"""`ftsup log inspect` and `ftsup log compact` on real directories."""

from __future__ import annotations

import asyncio
import json
import pathlib

import pytest

from ftsup.supervisor.core.events import NodeRegistered, NodeRole
from ftsup.supervisor.core.evolve import apply_record
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.embedded import SEGMENT_HEADER, EmbeddedLog
from ftsup.supervisor.eventlog.inspect import main


async def make_log(directory: pathlib.Path, count: int) -> None:
    log = EmbeddedLog(directory, segment_bytes=4096)
    for i in range(count):
        await log.append([NodeRegistered(f"n{i}", 1, NodeRole.ACTIVE, "127.0.0.1", 9000, 8)], term=0, time_unix_s=0.0)
    state = ClusterState()  # an honest snapshot: the fold of the first records
    for record in list(log.read())[: min(10, count)]:
        state = apply_record(state, record)
    await log.save_snapshot(state)
    log.close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in argv else {"text": out}


async def test_inspect_lists_segments_and_snapshots_and_verifies_every_crc(tmp_path, capsys):
    await make_log(tmp_path, 120)
    code, report = run(capsys, "inspect", str(tmp_path), "--json")
    assert code == 0 and report["ok"] and report["last_seq"] == 120 and report["first_seq"] == 1
    assert len(report["segments"]) > 1 and {s["status"] for s in report["segments"]} == {"ok"}
    assert report["snapshots"] == [dict(file=f"{10:020d}.snap", seq=10, bytes=report["snapshots"][0]["bytes"],
                                        is_usable=True, problem="")]
    code, text = run(capsys, "inspect", str(tmp_path))
    assert code == 0 and "OK: every CRC checks out" in text["text"]


async def test_inspect_reports_corruption_without_touching_anything(tmp_path, capsys):
    await make_log(tmp_path, 120)
    first = sorted((tmp_path / "segments").iterdir())[0]
    data = bytearray(first.read_bytes())
    data[SEGMENT_HEADER.size + 20] ^= 0x01
    first.write_bytes(bytes(data))
    code, report = run(capsys, "inspect", str(tmp_path), "--json")
    assert code == 1 and not report["ok"]
    assert report["segments"][0]["status"] == "corrupt" and "CRC-32C mismatch" in report["problems"][0]
    assert first.read_bytes() == bytes(data)


async def test_a_torn_tail_is_healthy_and_left_for_the_next_open(tmp_path, capsys):
    await make_log(tmp_path, 3)
    last = sorted((tmp_path / "segments").iterdir())[-1]
    with open(last, "ab") as handle:
        handle.write(b"\x99\x00")
    code, report = run(capsys, "inspect", str(tmp_path), "--json")
    assert code == 0 and report["segments"][-1]["status"] == "torn_tail"
    assert last.read_bytes().endswith(b"\x99\x00")


def test_compact_snapshots_the_head_and_inspect_then_shows_the_shorter_log(tmp_path, capsys):
    asyncio.run(make_log(tmp_path, 400))
    code, result = run(capsys, "compact", str(tmp_path), "--json")
    assert code == 0 and result["snapshot_seq"] == 400 and result["records_compacted"] > 0
    code, report = run(capsys, "inspect", str(tmp_path), "--json")
    assert code == 0 and report["first_seq"] > 1 and report["last_seq"] == 400
    reopened = EmbeddedLog(tmp_path)
    state = reopened.load_snapshot()
    assert state is not None and len(state.nodes) == 400
    reopened.close()


def test_compact_refuses_while_the_log_is_held(tmp_path, capsys):
    asyncio.run(make_log(tmp_path, 5))
    holder = EmbeddedLog(tmp_path)
    code = main(["compact", str(tmp_path)])
    assert code == 1 and "in use by another process" in capsys.readouterr().err
    holder.close()
