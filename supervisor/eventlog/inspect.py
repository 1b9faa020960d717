"""`ftsup log inspect DIR` and `ftsup log compact DIR`: the offline tools for a bad night.

inspect reads everything and changes nothing (safe while a supervisor runs): the format, who
holds the lock, every segment with its seq range and whether every CRC checks out, every
snapshot and whether it is usable, and the last seq. compact (supervisor stopped: it takes the
lock) replays the log, writes a snapshot at the head and drops the segments it covers.
Exit codes: 0 healthy (a torn tail counts as healthy: the next open truncates it), 1 corruption
or an unusable directory, 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import pathlib
import sys
from dataclasses import asdict, dataclass
from typing import Any

from ftsup.supervisor.core.evolve import apply_record
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog import snapshots
from ftsup.supervisor.eventlog.api import LogError
from ftsup.supervisor.eventlog.embedded import EmbeddedLog, examine_segment, list_segment_paths

EXIT_OK, EXIT_CORRUPT, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class SegmentReport:
    file: str
    first_seq: int
    last_seq: int
    records: int
    bytes: int
    status: str  # ok | torn_tail | corrupt
    problem: str


@dataclass(frozen=True, slots=True)
class SnapshotReport:
    file: str
    seq: int
    bytes: int
    is_usable: bool
    problem: str


def lock_holder(directory: pathlib.Path) -> str | None:
    path = directory / "LOCK"
    if not path.exists():
        return None
    with open(path, "rb") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().decode(errors="replace").strip() or "unknown"
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return None


def inspect(directory: pathlib.Path) -> dict[str, Any]:
    format_path = directory / "FORMAT"
    report: dict[str, Any] = {
        "directory": str(directory),
        "format": format_path.read_text().strip() if format_path.exists() else None,
        "locked_by_pid": lock_holder(directory),
    }
    found = list_segment_paths(directory)
    segments = []
    for index, (first_seq, path) in enumerate(found):
        check = examine_segment(path, first_seq, path.read_bytes(), is_last=index == len(found) - 1)
        status = "ok" if not check.problem else "torn_tail" if check.is_torn_tail else "corrupt"
        segments.append(SegmentReport(path.name, first_seq, first_seq + check.count - 1, check.count,
                                      check.file_bytes, status, check.problem))
    for before, after in zip(segments, segments[1:]):
        if after.first_seq != before.last_seq + 1 and before.status != "corrupt":
            segments[segments.index(after)] = SegmentReport(
                after.file, after.first_seq, after.last_seq, after.records, after.bytes, "corrupt",
                f"starts at seq {after.first_seq}, previous segment ends at {before.last_seq}",
            )
    snaps = []
    for snap in snapshots.list_snapshots(directory / "snapshots"):
        try:
            snapshots.read_snapshot(snap)
            snaps.append(SnapshotReport(snap.path.name, snap.seq, snap.path.stat().st_size, True, ""))
        except (snapshots.BadSnapshot, LogError) as exc:
            snaps.append(SnapshotReport(snap.path.name, snap.seq, snap.path.stat().st_size, False, str(exc)))
    report["segments"] = [asdict(s) for s in segments]
    report["snapshots"] = [asdict(s) for s in snaps]
    report["first_seq"] = segments[0].first_seq if segments else None
    report["last_seq"] = segments[-1].last_seq if segments else None
    compacted = bool(segments) and segments[0].first_seq > 1
    covered = any(s.is_usable and s.seq + 1 >= segments[0].first_seq for s in snaps) if compacted else True
    problems = [s.problem for s in segments if s.status == "corrupt"]
    if report["format"] is None:
        legacy = (directory / "events.log").exists()
        problems.append("an ftsup 0.1 single-file log (events.log): not readable by this version" if legacy
                        else "no FORMAT file: not an ftsup event log directory")
    if not covered:
        problems.append(f"records before seq {segments[0].first_seq} were compacted and no usable snapshot covers them")
    report["problems"] = problems
    report["ok"] = not problems
    return report


def render(report: dict[str, Any]) -> str:
    lines = [
        f"event log   {report['directory']}",
        f"format      {report['format'] or '(none: not initialised)'}",
        f"lock        {'held by pid ' + report['locked_by_pid'] + ' (a supervisor is running)' if report['locked_by_pid'] else 'free'}",
        f"records     {report['first_seq']}..{report['last_seq']}" if report["segments"] else "records     none",
        "",
        f"{'SEGMENT':<28} {'SEQS':<25} {'RECORDS':>8} {'BYTES':>11}  STATUS",
    ]
    for s in report["segments"]:
        lines.append(f"{s['file']:<28} {str(s['first_seq']) + '..' + str(s['last_seq']):<25} {s['records']:>8}"
                     f" {s['bytes']:>11}  {s['status']}{': ' + s['problem'] if s['problem'] else ''}")
    lines += ["", f"{'SNAPSHOT':<28} {'SEQ':<25} {'':>8} {'BYTES':>11}  STATUS"]
    for s in report["snapshots"]:
        status = "usable" if s["is_usable"] else f"UNUSABLE: {s['problem']}"
        lines.append(f"{s['file']:<28} {s['seq']:<25} {'':>8} {s['bytes']:>11}  {status}")
    lines.append("")
    lines.append("OK: every CRC checks out" if report["ok"] else "PROBLEMS:\n  " + "\n  ".join(report["problems"]))
    return "\n".join(lines)


async def compact(directory: pathlib.Path) -> dict[str, Any]:
    log = EmbeddedLog(directory)  # takes the lock: refuses while a supervisor runs
    try:
        state = log.load_snapshot() or ClusterState()
        for record in log.read(state.applied_seq + 1):
            state = apply_record(state, record)
        await log.save_snapshot(state)
        if log.load_snapshot() != state:
            raise LogError(f"the snapshot just written in {directory} does not read back equal; nothing compacted")
        removed = await log.compact(through_newest=True)
        return {"snapshot_seq": state.applied_seq, "records_compacted": removed, "first_seq": log.first_seq,
                "truncated_bytes": log.truncated_bytes, "warnings": log.snapshot_warnings}
    finally:
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup log", description="Inspect or compact an embedded event log.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("inspect", "verify every CRC and list segments and snapshots (read-only)"),
                       ("compact", "snapshot at the head and drop covered segments (supervisor stopped)")):
        command = sub.add_parser(name, help=text)
        command.add_argument("directory", type=pathlib.Path, help="the supervisor's --data-dir")
        command.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        print(f"ftsup log: {args.directory} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "inspect":
            report = inspect(args.directory)
            print(json.dumps(report) if args.json else render(report))
            return EXIT_OK if report["ok"] else EXIT_CORRUPT
        result = asyncio.run(compact(args.directory))
        print(json.dumps(result) if args.json else
              f"snapshot written at seq {result['snapshot_seq']}; {result['records_compacted']} records compacted;"
              f" the log now starts at seq {result['first_seq']}")
        return EXIT_OK
    except (LogError, OSError) as exc:
        print(f"ftsup log {args.command}: {exc}", file=sys.stderr)
        return EXIT_CORRUPT
