"""`ftsup bench checkpoint --quick` against the session's real S3 server: ftsup's sharded commit,
the raw boto3 upload and s3torchconnector's DCP writer in the same rank processes, each leaving a
committed checkpoint. The bench runs once; ftsup's side is checked whatever is installed, the
peer's only with the bench-peers extra (without it, its entry must say it is not installed)."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest

from ftsup.harness import cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bench(s3_server, tmp_path_factory) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp("bench-checkpoint")
    with pytest.MonkeyPatch.context() as monkeypatch:
        for key, value in s3_server.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("TMPDIR", str(tmp_path))
        argv = ["bench", "checkpoint", "--quick", "--ranks", "2", "--mb-per-rank", "4", "--threads", "2",
                "--endpoint", s3_server.endpoint_url, "--bucket", s3_server.bucket, "--dir", str(tmp_path), "--json"]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert cli.main(argv) == 0
    return json.loads(printed.getvalue())


def test_the_checkpoint_bench_commits_ftsups_checkpoint(bench) -> None:
    assert bench["checkpoints_committed"] == 1 and bench["commit_mbps"] > 0
    peer = bench["s3torchconnector"]
    assert peer["ran"] or peer["reason"].startswith("not installed"), peer  # anything else is a failure to report


def test_the_checkpoint_bench_times_s3torchconnector_beside_ftsups_commit(bench) -> None:
    peer = bench["s3torchconnector"]
    if not peer["ran"]:
        pytest.skip(f"s3torchconnector not measured here (the bench-peers extra): {peer['reason']}")
    assert peer["checkpoints_committed"] == 1  # DCP's .metadata was written: the save committed
    assert peer["objects_per_checkpoint"] == 2 * 2 + 1  # a file per rank per writer thread + .metadata
    assert peer["committed_s"] > 0 and peer["mbps"] == round(bench["bytes_total"] / 1e6 / peer["committed_s"], 1)
    assert peer["ftsup_committed_s"] == bench["commit_s_rounds"][0]
