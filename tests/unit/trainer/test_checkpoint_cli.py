"""`ftsup checkpoints list|gc` on a local directory store: the JSON contract, dry runs, exit codes."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from ftsup.checkpoint import flows
from ftsup.checkpoint.cli import main, parse_duration_s
from ftsup.checkpoint.local import LocalDirStore
from ftsup.checkpoint.manifest import Layout, Topology, Versions, checkpoint_id_for
from ftsup.harness import cli as ftsup_cli

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
ROOT = Layout("")


@pytest.fixture
def location(tmp_path):
    """Two commits (steps 1, 2) and a temp file left by a writer killed two hours ago."""
    store = LocalDirStore(tmp_path)
    for step in (1, 2):
        flows.save({"w": torch.full((3,), float(step))}, store, ROOT, checkpoint_id_for(step, "a"), step,
                   Topology(1, 1), Versions("d", "t"))
    store.close()
    leftover = tmp_path / checkpoint_id_for(3, "crashed") / ".ftsup-tmp-feed"
    leftover.parent.mkdir()
    leftover.write_bytes(b"half a shard")
    two_hours_ago = time.time() - 7200
    os.utime(leftover, (two_hours_ago, two_hours_ago))
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip().startswith("{") else {"text": out}


def test_gc_without_keep_aborts_only_stale_uploads_and_counts_them(location, capsys):
    code, dry = run(capsys, "gc", str(location), "--dry-run", "--json")
    assert code == 0 and dry["dry_run"] and dry["uploads_aborted"] == 1
    assert (location / checkpoint_id_for(3, "crashed") / ".ftsup-tmp-feed").exists()

    code, done = run(capsys, "gc", str(location), "--json")
    assert code == 0
    assert (done["uploads_aborted"], done["uploads_kept"], done["multipart_older_than_s"]) == (1, 0, 3600.0)
    assert done["uploads"][0]["key"] == f"{checkpoint_id_for(3, 'crashed')}/.ftsup-tmp-feed"
    assert done["uploads"][0]["age_s"] >= 7200 and done["uploads"][0]["stale"]
    assert done["checkpoints_deleted"] == [] and done["checkpoints_kept"] is None  # no --keep: no retention
    assert not (location / checkpoint_id_for(3, "crashed")).exists()
    code, listed = run(capsys, "list", str(location), "--json")
    assert [c["step"] for c in listed["committed"]] == [1, 2] and listed["uploads"] == []


def test_gc_with_keep_applies_retention_and_respects_the_age_threshold(location, capsys):
    code, result = run(capsys, "gc", str(location), "--keep", "1", "--multipart-older-than", "3h", "--json")
    assert code == 0
    assert result["checkpoints_deleted"] == [checkpoint_id_for(1, "a")]
    assert result["checkpoints_kept"] == [checkpoint_id_for(2, "a")]
    assert (result["uploads_aborted"], result["uploads_kept"]) == (0, 1)  # two hours old < 3 h
    assert "younger than 10800s" in result["uploads"][0]["reason"]


def test_a_checkpoint_named_in_flight_keeps_its_uploads(location, capsys):
    code, result = run(capsys, "gc", str(location), "--in-flight", checkpoint_id_for(3, "crashed"), "--json")
    assert code == 0 and result["uploads_aborted"] == 0 and "in flight" in result["uploads"][0]["reason"]


def test_the_table_says_what_was_aborted(location, capsys):
    code, out = run(capsys, "gc", str(location))
    assert code == 0
    assert "aborted 1 unfinished uploads older than 3600s" in out["text"]
    assert "retention: not run (no --keep)" in out["text"]


@pytest.mark.parametrize("argv, message", [
    (["gc", "{loc}", "--multipart-older-than", "soon"], "duration 'soon'"),
    (["gc", "{loc}", "--keep", "0"], "--keep must be >= 1"),
    (["list", "{loc}/missing"], "is not a directory"),
    (["list", "ftp://bucket/x"], "scheme 'ftp'"),
])
def test_usage_errors_exit_2_naming_the_value(location, capsys, argv, message):
    assert main([a.replace("{loc}", str(location)) for a in argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("1h", 3600), ("1.5d", 129600)])
def test_durations_take_a_unit(text, seconds):
    assert parse_duration_s(text) == seconds


def test_ftsup_has_the_checkpoints_command():
    assert "checkpoints" in ftsup_cli.SUBCOMMANDS
