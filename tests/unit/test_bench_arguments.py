"""The benches' shared command-line pieces: size lists and the per-run work directory."""

from __future__ import annotations

import argparse

import pytest

from ftsup.bench import arguments


def test_a_size_list_is_parsed_and_out_of_range_values_are_a_usage_error():
    nodes = arguments.int_list(1, 100_000)
    assert nodes("1250,12500") == [1250, 12500]
    for bad in ("", "12,x", "0", "100001"):
        with pytest.raises(argparse.ArgumentTypeError):
            nodes(bad)


def test_a_missing_work_directory_is_made_and_each_run_gets_its_own(tmp_path):
    parent = tmp_path / "not" / "yet"
    first = arguments.run_directory("bench-", parent)
    second = arguments.run_directory("bench-", parent)
    assert first.is_dir() and second.is_dir() and first != second
    assert first.parent == parent and first.name.startswith("bench-")
