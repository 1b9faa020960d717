"""`ftsup xid [FILE|-] [--json]`: every Xid in kernel-log text, with its meaning and the policy's action.

Each line is judged on its own (no repeat counting across the file): the output says what the
policy would do about that line alone. Exit codes: 0 read and reported (Xids found or not),
1 the input could not be read, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from ftsup.agent.core.xid import parse_xid_line
from ftsup.supervisor.core.policies.xid import XidPolicyConfig, judge_xid

EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE = 0, 1, 2


def scan(lines: Iterable[str], gpu_by_pci: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Returns one row per Xid line: the JSON shape of `ftsup xid --json` (`line` is 1-based)."""
    config = XidPolicyConfig()
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        record = parse_xid_line(line, gpu_by_pci)
        if record is None:
            continue
        verdict = judge_xid((), record, 0.0, config)
        rows.append(
            {
                "line": number,
                "pci": record.pci,
                "gpu": record.gpu,
                "code": record.code,
                "pid": record.pid,
                "process": record.process,
                "meaning": verdict.meaning,
                "action": verdict.action.value,
            }
        )
    return rows


def render_table(rows: list[dict[str, Any]]) -> str:
    """Renders the rows as an aligned text table (pure)."""
    if not rows:
        return "no Xid lines found"
    header = ("LINE", "XID", "PCI", "GPU", "PID", "PROCESS", "ACTION", "MEANING")
    cells = [
        tuple(
            "-" if value is None else str(value)
            for value in (r["line"], r["code"], r["pci"], r["gpu"], r["pid"], r["process"], r["action"], r["meaning"])
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header) - 1)]
    out = []
    for row in [header, *cells]:
        out.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return "\n".join(line.rstrip() for line in out)


def _gpu_map(pairs: list[str]) -> dict[str, int]:
    mapping: dict[str, int] = {}
    for pair in pairs:
        pci, sep, index = pair.rpartition("=")
        if not sep or not pci or not index.isdigit():
            raise ValueError(f"--gpu expects PCI=INDEX (e.g. 00000000:3B:00.0=3), got {pair!r}")
        mapping[pci] = int(index)
    return mapping


def _read(path: str, stdin: TextIO) -> list[str]:
    if path == "-":
        text = stdin.read()
    else:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    # Split on "\n" only: str.splitlines also splits on form feeds and Unicode separators, which
    # would shift line numbers away from what an editor or `grep -n` shows.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ftsup xid",
        description="Print every NVIDIA Xid in kernel-log text (dmesg, journalctl -k, syslog) with its "
        "meaning and the action ftsup's policy takes. Each line is judged on its own.",
    )
    parser.add_argument("file", nargs="?", default="-", help="kernel-log file, or - for stdin (default)")
    parser.add_argument("--json", action="store_true", help='print one object {"xids": [...]}')
    parser.add_argument(
        "--gpu", action="append", default=[], metavar="PCI=INDEX",
        help="GPU index of a PCI id, as nvidia-smi shows it (repeatable)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code == 0 else EXIT_USAGE
    try:
        gpu_by_pci = _gpu_map(args.gpu)
    except ValueError as exc:
        print(f"ftsup xid: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        lines = _read(args.file, sys.stdin)
    except OSError as exc:
        print(f"ftsup xid: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    rows = scan(lines, gpu_by_pci)
    print(json.dumps({"xids": rows}) if args.json else render_table(rows))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
