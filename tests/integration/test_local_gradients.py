"""Local gradients on real gloo ranks: DDP without the bit-exact hook (compute time by section
timing, local-gradient digests before the all-reduce) and FSDP2 (digests of the local shard)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ftsup.harness.cluster import free_port

pytestmark = pytest.mark.integration
WORLD = 2


def run_ranks(module: str, out: pathlib.Path, tmp_path: pathlib.Path, *flags: str) -> list:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-m", module, "--rank", str(r), "--world", str(WORLD),
                               "--port", str(port), "--out", str(out), *flags],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(WORLD)]
    try:
        outputs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * WORLD, outputs
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD)]


def test_without_the_hook_compute_time_excludes_the_sync_wait_and_local_grads_are_digested(
    tmp_path: pathlib.Path,
) -> None:
    fast, slow = run_ranks("tests.support.ddp_clock_ranks", tmp_path / "out", tmp_path, "--slow-s", "0.5")
    for rank in (fast, slow):
        for step in rank:
            # The clock took this rank's own gradients, before DDP averaged them...
            assert step["local_digest"] == step["plain_digest"]
            assert step["local_digest"] != step["averaged_digest"]
    # ...and the averaged ones agree on both ranks.
    assert [s["averaged_digest"] for s in fast] == [s["averaged_digest"] for s in slow]
    for f, s in zip(fast, slow):
        # Rank 1's half second is its compute; rank 0 waits as long in the all-reduce, but that
        # wait is not its compute: the straggler detector sees rank 1 alone.
        assert s["compute_s"] >= 0.5
        assert f["step_s"] >= 0.4
        assert f["compute_s"] < s["compute_s"] - 0.25


def test_fsdp2_local_gradient_digests_cover_the_local_shard(tmp_path: pathlib.Path) -> None:
    ranks = run_ranks("tests.support.fsdp_grad_digest_ranks", tmp_path / "out", tmp_path)
    for rank in ranks:
        assert sum(rank["local_numel"]) < sum(rank["global_numel"])  # the gradients are really sharded
        assert rank["taken"] == rank["by_hand"]  # the shard's bits, names and local shapes: nothing gathered
        assert rank["flipped"] != rank["taken"]  # one bit of this rank's shard shows
        assert rank["again"] == rank["taken"]  # the same step again: the same digest
    assert ranks[0]["taken"] != ranks[1]["taken"]  # each rank owns another shard
