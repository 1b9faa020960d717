"""`ftsup xid`: the JSON contract, the table, and the exit codes."""

from __future__ import annotations

import json
import pathlib

from ftsup.harness import cli
from ftsup.harness.xid_cli import main

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "xid"

LOG = "\n".join(
    [
        "[ 1843.308145] NVRM: GPU at PCI:0000:3b:00: GPU-7f3c1a52-9d0e-4b6f-a1c2-3e4d5f607182",
        "[ 1843.308152] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        "Dec  2 10:45:02 worker4 python[99]: NVRM: Xid (PCI:0000:3b:00): 79, quoted by a user process",
        "kernel: NVRM: Xid (PCI:0000:18:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked",
        "kernel: NVRM: Xid (PCI:0000:18:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked",
        "NVRM: Xid (PCI:0000:01:00): 14, Channel 00000001",
    ]
) + "\n"


def test_json_lists_every_xid_with_line_meaning_and_action(tmp_path, capsys):
    path = tmp_path / "kern.log"
    path.write_text(LOG)
    assert main([str(path), "--json", "--gpu", "00000000:3B:00.0=2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "xids": [
            {"line": 2, "pci": "0000:3b:00", "gpu": 2, "code": 79, "pid": 1234, "process": "python",
             "meaning": "GPU has fallen off the bus: unreachable until the node reboots", "action": "quarantine_node"},
            {"line": 4, "pci": "0000:18:00", "gpu": None, "code": 63, "pid": None, "process": None,
             "meaning": "a memory row remap or page retirement was recorded; applies at the next reset",
             "action": "ignore"},
            # Judged on its own: a repeat within the file does not escalate.
            {"line": 5, "pci": "0000:18:00", "gpu": None, "code": 63, "pid": None, "process": None,
             "meaning": "a memory row remap or page retirement was recorded; applies at the next reset",
             "action": "ignore"},
            {"line": 6, "pci": "0000:01:00", "gpu": None, "code": 14, "pid": None, "process": None,
             "meaning": "unknown Xid 14 (not in the policy table)", "action": "restart_job"},
        ]
    }


def test_fixture_corpus_reports_exactly_the_expected_lines(capsys):
    expected = json.loads((FIXTURE / "expected.json").read_text())
    assert main([str(FIXTURE / "kernel.log"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["xids"]
    assert [row["line"] for row in rows] == sorted(int(n) for n in expected["parsed"])
    assert all(set(row) == {"line", "pci", "gpu", "code", "pid", "process", "meaning", "action"} for row in rows)


def test_table_output_has_a_header_and_one_row_per_xid(tmp_path, capsys):
    path = tmp_path / "kern.log"
    path.write_text(LOG)
    assert main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:7] == ["LINE", "XID", "PCI", "GPU", "PID", "PROCESS", "ACTION"]
    assert len(lines) == 5 and "quarantine_node" in lines[1]


def test_no_xids_is_still_success(tmp_path, capsys):
    path = tmp_path / "empty.log"
    path.write_text("[ 1.0] nothing to see\n")
    assert main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"xids": []}


def test_unreadable_file_exits_1_and_bad_usage_exits_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing.log")]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert main(["--no-such-flag"]) == 2
    assert main(["--gpu", "nonsense", str(tmp_path)]) == 2


def test_ftsup_dispatches_xid(tmp_path, capsys):
    path = tmp_path / "kern.log"
    path.write_text(LOG)
    assert cli.main(["xid", str(path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["xids"]) == 4


def test_ftsup_log_offers_inspect_and_compact(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:
        cli.main(["log", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "inspect" in out and "compact" in out
