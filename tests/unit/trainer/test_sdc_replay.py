"""The SDC replay is bit-exact: a verifier that replays step S from a rank's snapshot of S - 1
recomputes every rank's local-gradient digest and the parameter digest after S exactly as the
live gloo run reported them, and a gradient flipped before the all-reduce (invisible to the
parameter vote) shows up as that rank's mismatch alone.

The live run is the example trainer itself on two offline gloo ranks (torchrun-style), keeping
its snapshots and step reports on disk (FTSUP_OFFLINE_DIR); the replay is the same entrypoint
started with FTSUP_SDC_REPLAY, as a verifier's agent starts it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ftsup.harness.cluster import free_port
from ftsup.trainer.replay import REPLAY_ENV, ReplayError, ReplayRequest

MODEL = ("--steps", "3", "--seed", "3", "--layers", "1", "--d-model", "32", "--heads", "2",
         "--batch-size", "4", "--seq-len", "16")
FLIP = ("--sdc-flip-step", "3", "--sdc-flip-rank", "1", "--sdc-flip-target", "grad", "--sdc-flip-bit", "20",
        "--sdc-flip-tensor", "blocks.0.mlp.0.weight", "--sdc-flip-index", "5")
WORLD = 2


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Two offline gloo ranks, 3 steps, rank 1's gradient flipped (one bit) at step 3."""
    out = tmp_path_factory.mktemp("live")
    port = str(free_port())
    procs = []
    for rank in range(WORLD):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "OMP_NUM_THREADS": "1", "FTSUP_OFFLINE_DIR": str(out)}
        procs.append(subprocess.Popen([sys.executable, "-m", "ftsup.trainer.examples.gpt", *MODEL, *FLIP, "--offline"],
                                      env=env, stdout=subprocess.DEVNULL, stderr=open(out / f"rank-{rank}.log", "wb")))
    for p in procs:
        p.wait(timeout=240)
    for step in (1, 2, 3):
        for rank in range(WORLD):  # completion is judged by the outputs: gloo may abort in teardown
            assert (out / f"rank-{rank}.step-{step}.snap").exists(), (out / f"rank-{rank}.log").read_text()[-2000:]
    return out


def reported(live: pathlib.Path, rank: int, step: int) -> dict:
    for line in (live / f"rank-{rank}.steps.jsonl").read_text().splitlines():
        report = json.loads(line)
        if int(report["step"]) == step:
            return report
    raise AssertionError(f"rank {rank} reported no step {step}")


def replay(live: pathlib.Path, tmp_path: pathlib.Path, step: int, rank: int, ranks: list[int],
           *, in_process: bool = True) -> dict:
    """Runs the trainer entrypoint in replay mode, as agent/sdc_check.py does (in a process of its
    own, or in this one to spare a torch import), and reads its answer."""
    snapshot = live / f"rank-{rank}.step-{step - 1}.snap"
    out = tmp_path / f"result-{step}-{rank}-{len(ranks)}.json"
    request = {"check_id": "sdc-1", "step": step, "rank": rank, "world_size": WORLD, "ranks": ranks,
               "snapshot_path": str(snapshot), "sha256": snapshot.with_suffix(".sha256").read_text(),
               "out_path": str(out)}
    request_path = tmp_path / f"request-{step}-{rank}-{len(ranks)}.json"
    request_path.write_text(json.dumps(request))
    if in_process:
        from ftsup.trainer.examples import gpt

        os.environ[REPLAY_ENV] = str(request_path)
        try:
            assert gpt.main([*MODEL, *FLIP]) == 0
        finally:
            del os.environ[REPLAY_ENV]
    else:
        env = {**os.environ, REPLAY_ENV: str(request_path), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "ftsup.trainer.examples.gpt", *MODEL, *FLIP], env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
    return {d["rank"]: d for d in json.loads(out.read_text())["recomputed"]}


def test_a_replayed_step_reproduces_every_ranks_gradient_and_the_update_bit_for_bit(live, tmp_path):
    got = replay(live, tmp_path, step=2, rank=0, ranks=[0, 1])
    for rank in range(WORLD):
        assert got[rank]["grad_digest"] == reported(live, rank, 2)["local_grad_digest"] != ""
        assert got[rank]["param_digest"] == reported(live, rank, 2)["param_digest"]


def test_a_gradient_flipped_before_the_all_reduce_is_that_ranks_mismatch_alone(live, tmp_path):
    # The vote cannot see it: both replicas hold the same (corrupted) parameters after step 3.
    assert reported(live, 0, 3)["param_digest"] == reported(live, 1, 3)["param_digest"]
    got = replay(live, tmp_path, step=3, rank=1, ranks=[0, 1], in_process=False)
    assert got[0]["grad_digest"] == reported(live, 0, 3)["local_grad_digest"]
    assert got[1]["grad_digest"] != reported(live, 1, 3)["local_grad_digest"]
    assert got[0]["param_digest"] == got[1]["param_digest"] != reported(live, 0, 3)["param_digest"]
    alone = replay(live, tmp_path, step=3, rank=1, ranks=[1])  # a large world replays one rank only
    assert alone == {1: {**got[1], "param_digest": ""}}


def test_a_replay_request_names_a_snapshot_of_the_step_before(tmp_path):
    request = tmp_path / "r.json"
    request.write_text(json.dumps({"check_id": "c", "step": 0, "rank": 0, "world_size": 2, "ranks": [0],
                                   "snapshot_path": "x", "sha256": "y", "out_path": "z"}))
    with pytest.raises(ReplayError, match="not replayable"):
        ReplayRequest.from_env({REPLAY_ENV: str(request)})
    assert ReplayRequest.from_env({}) is None
