"""The kernel-log Xid parser against the fixture corpus and the formats it must accept or refuse."""

from __future__ import annotations

import json
import pathlib

import pytest

from ftsup.agent.core.xid import XidRecord, normalize_pci, parse_gpu_at_line, parse_xid_line

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "xid"
LINES = (FIXTURES / "kernel.log").read_text().split("\n")[:-1]
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
REQUIRED_CODES = {13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 149, 154}


def test_expectations_list_every_fixture_line_exactly_once():
    listed = [int(n) for n in EXPECTED["parsed"]] + EXPECTED["rejected"]
    assert sorted(listed) == list(range(1, len(LINES) + 1))


def test_fixture_covers_every_required_code():
    assert {entry["code"] for entry in EXPECTED["parsed"].values()} >= REQUIRED_CODES


@pytest.mark.parametrize("number", sorted(int(n) for n in EXPECTED["parsed"]))
def test_fixture_xid_line_parses_to_its_expected_record(number):
    want = EXPECTED["parsed"][str(number)]
    assert parse_xid_line(LINES[number - 1]) == XidRecord(gpu=None, **want)


@pytest.mark.parametrize("number", EXPECTED["rejected"])
def test_fixture_look_alike_line_is_not_an_xid(number):
    assert parse_xid_line(LINES[number - 1]) is None


def test_gpu_index_comes_from_the_callers_pci_map_in_nvidia_smi_form():
    line = "[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    assert parse_xid_line(line, {"00000000:3B:00.0": 5}).gpu == 5
    assert parse_xid_line(line, {"00000000:3C:00.0": 6}).gpu is None
    assert parse_xid_line(line).gpu is None


def test_pci_ids_normalize_to_the_kernel_form():
    assert normalize_pci("00000000:3B:00.0") == "0000:3b:00"
    assert normalize_pci("PCI:0000:3b:00") == "0000:3b:00"
    assert normalize_pci("0018:01:00") == "0018:01:00"


def test_pci_with_a_function_digit_is_accepted_and_normalized():
    record = parse_xid_line("NVRM: Xid (PCI:0000:00:01.0): 79, pid='<unknown>', name='<unknown>', GPU has fallen off the bus.")
    assert record == XidRecord("0000:00:01", None, 79, None, None, "GPU has fallen off the bus.")


def test_pid_followed_by_a_space_instead_of_a_comma_still_splits():
    record = parse_xid_line("NVRM: Xid (PCI:0000:01:00): 31, pid=1 CE0")
    assert (record.pid, record.process, record.message) == (1, None, "CE0")


def test_trailing_carriage_return_and_whitespace_are_ignored():
    assert parse_xid_line("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\r\n").message == (
        "GPU has fallen off the bus."
    )


def test_user_space_process_quoting_an_xid_is_not_the_driver():
    assert parse_xid_line("Dec  2 10:45:02 worker4 python3[99]: NVRM: Xid (PCI:0000:3b:00): 79, x") is None
    assert parse_xid_line("Dec  2 10:45:02 worker4 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x") is not None


def test_gpu_at_preamble_maps_pci_to_uuid_but_is_not_an_xid():
    line = LINES[0]
    assert parse_xid_line(line) is None
    assert parse_gpu_at_line(line) == ("0000:3b:00", "GPU-7f3c1a52-9d0e-4b6f-a1c2-3e4d5f607182")
    assert parse_gpu_at_line(LINES[2]) is None
