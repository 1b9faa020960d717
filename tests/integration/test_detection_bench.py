"""`ftsup bench detection --quick` on real processes: the JSON a user reads, with sane figures."""

from __future__ import annotations

import json

import pytest

from ftsup.harness import cli

pytestmark = pytest.mark.integration


def test_detection_bench_reports_kill_and_silent_detection_with_a_baseline(capsys):
    assert cli.main(["bench", "detection", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"kill_detect_s", "silent_detect_s", "baseline"} <= set(result)
    # A killed agent closes its stream: detection must beat heartbeat silence, and the baseline.
    assert 0 < result["kill_detect_s"] < result["silent_detect_s"] <= 2 * result["heartbeat_interval_s"] + 0.5
    assert result["kill_detect_s"] < result["baseline"]["kill_detect_s"]
