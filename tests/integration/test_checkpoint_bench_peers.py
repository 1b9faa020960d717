"""`ftsup bench checkpoint --quick` against the session's real S3 server: ftsup's sharded commit,
the raw boto3 upload and s3torchconnector's DCP writer in the same rank processes, each leaving a
committed checkpoint; without the bench-peers extra the peer's entry says it is not installed."""

from __future__ import annotations

import json

import pytest

from ftsup.harness import cli

pytestmark = pytest.mark.integration


def test_checkpoint_bench_times_s3torchconnector_beside_ftsups_commit(capsys, monkeypatch, tmp_path, s3_server):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    argv = ["bench", "checkpoint", "--quick", "--ranks", "2", "--mb-per-rank", "4", "--threads", "2",
            "--endpoint", s3_server.endpoint_url, "--bucket", s3_server.bucket, "--dir", str(tmp_path), "--json"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["checkpoints_committed"] == 1 and result["commit_mbps"] > 0
    peer = result["s3torchconnector"]
    if not peer["ran"]:
        assert peer["reason"].startswith("not installed"), peer  # anything else is a failure to report
        pytest.skip(f"s3torchconnector not measured: {peer['reason']}")
    assert peer["checkpoints_committed"] == 1  # DCP's .metadata was written: the save committed
    assert peer["objects_per_checkpoint"] == 2 * 2 + 1  # a file per rank per writer thread + .metadata
    assert peer["committed_s"] > 0 and peer["mbps"] == round(result["bytes_total"] / 1e6 / peer["committed_s"], 1)
    assert peer["ftsup_committed_s"] == result["commit_s_rounds"][0]
