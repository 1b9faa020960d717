"""The peers' figures in `ftsup bench snapshot` and `ftsup bench checkpoint`: how a peer's raw
timings become its JSON entry, how ftsup is compared with the best peer that ran, and that a
peer which could not run says why instead of vanishing."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from ftsup.bench import checkpoint, snapshot
from ftsup.bench._snapshot_peers import BASELINES


def _measured(call_s: list[float], wait_s: float = 0.0) -> dict:
    return {"ran": True, "state_bytes": 1000, "rss_before_bytes": 5000, "rss_peak_bytes": 7500,
            "samples": [{"call_s": c, "optimizer_wait_s": wait_s, "stored_s": c + 1.0} for c in call_s]}


def test_every_baseline_the_runner_knows_has_a_configuration_and_a_node_loss_note():
    assert set(BASELINES) == set(snapshot.PEER_BASELINES) == set(snapshot.PEER_NODE_LOSS)


def test_a_peer_that_ran_reports_pause_stored_time_memory_and_why_no_copy_survives_the_node():
    entry = snapshot.summarize_peer("dcp_async_save", _measured([0.1, 0.3, 0.2], wait_s=0.05))
    assert entry["ran"] and entry["pause_s"] == 0.25  # median of call + the optimizer's wait
    assert entry["pause_samples_s"] == [0.15, 0.35, 0.25]
    assert entry["stored_s"] == 1.2
    assert entry["memory_bytes"] == 2500
    assert entry["survives_node_loss_s"] is None and "local disk" in entry["survives_node_loss_why_not"]


def test_a_peer_that_could_not_run_keeps_its_reason():
    entry = snapshot.summarize_peer("nvrx_local", {"ran": False, "reason": "CUDA-only: AssertionError at x.py:1"})
    assert entry == {"config": snapshot.PEER_BASELINES["nvrx_local"], "ran": False,
                     "reason": "CUDA-only: AssertionError at x.py:1"}


def test_ftsup_is_compared_with_the_fastest_peer_that_ran():
    peers = {
        "dcp_async_save": snapshot.summarize_peer("dcp_async_save", _measured([0.4])),
        "dlrover_flash_memory": snapshot.summarize_peer("dlrover_flash_memory", _measured([0.2])),
        "nvrx_local": snapshot.summarize_peer("nvrx_local", {"ran": False, "reason": "CUDA-only"}),
    }
    ftsup = {"pause_s": 0.05, "survives_node_loss_s": 0.8, "memory_bytes": 9000}
    verdict = snapshot.compare(ftsup, peers)
    assert verdict["pause"] == {"best_peer": "dlrover_flash_memory", "peer_s": 0.2, "ftsup_s": 0.05, "ratio": 0.25}
    assert verdict["memory"]["lightest_peer"] in {"dcp_async_save", "dlrover_flash_memory"}
    assert verdict["survives_node_loss"]["best_peer"] is None  # no peer here keeps a copy off the node
    assert verdict["survives_node_loss"]["ftsup_s"] == 0.8


def test_no_peer_ran_leaves_only_the_node_loss_note():
    verdict = snapshot.compare({"pause_s": 0.1, "survives_node_loss_s": 1.0, "memory_bytes": 1},
                               {"nvrx_local": {"ran": False, "reason": "not installed"}})
    assert set(verdict) == {"survives_node_loss"}


def test_s3torchconnector_summary_says_why_it_did_not_run():
    assert checkpoint.s3tc_summary({}, 100, 1.0, None, "", "not installed (the bench-peers extra)") == {
        "ran": False, "reason": "not installed (the bench-peers extra)"}
    failed = checkpoint.s3tc_summary({"s3tc_error": "S3Exception: no such bucket", "s3tc_s": []}, 100, 1.0,
                                     "/venv/bin/python", "1.5.0", "")
    assert failed == {"ran": False, "reason": "its save failed: S3Exception: no such bucket"}


def test_s3torchconnector_summary_compares_its_commit_with_ftsups():
    measured = {"s3tc_s": [2.0, 4.0, 3.0], "s3tc_error": None, "s3tc_committed": 3, "s3tc_objects_per_checkpoint": 9}
    result = checkpoint.s3tc_summary(measured, 300_000_000, 1.5, "/venv/bin/python", "1.5.0", "")
    assert result["ran"] and result["committed_s"] == 3.0 and result["mbps"] == 100.0
    assert result["ftsup_speedup"] == 2.0 and result["checkpoints_committed"] == 3


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.skipif(_installed("dlrover"), reason="dlrover is installed in this venv: nothing is missing")
def test_a_missing_peer_package_is_reported_before_any_work(capsys, tmp_path):
    from ftsup.bench import _snapshot_peers

    argv = ["--baseline", "dlrover_flash_memory", "--state-mb", "1", "--saves", "1", "--dir", str(tmp_path)]
    assert _snapshot_peers.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["ran"] is False and result["reason"].startswith("not installed: no module named 'dlrover'")
    assert not any(tmp_path.iterdir())  # no model built, nothing written


@pytest.mark.skipif(_installed("s3torchconnector"), reason="s3torchconnector is installed in this venv")
def test_s3torchconnector_missing_everywhere_is_named_with_each_python_tried():
    python, version, why_not = checkpoint.s3tc_python(pathlib.Path(sys.executable))
    assert python is None and version == ""
    assert why_not.startswith("not installed") and "No module named 's3torchconnector'" in why_not

