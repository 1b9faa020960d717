"""`ftsup run` with an unmodified torchrun script (issue 13, level 0): real ftsup processes,
real torch.distributed ranks on gloo, and torch's own torchrun for the environment comparison.

(a)+(c) one rank SIGKILLed, then a whole simulated node: the script resumes from its own
checkpoint each time, the spare takes the lost node's place, and `ftsup run` exits 0.
(b) past `--max-restarts` the job ends FAILED: exit 1, a JobFailed naming the rank, its exit
code and its traceback. (d) the ranks see torchrun's variables with torchrun's values.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from ftsup.harness import orphan_guard
from ftsup.harness.cluster import wait_until

pytestmark = pytest.mark.integration

SCRIPT = pathlib.Path(__file__).parents[1] / "support" / "plain_ddp.py"
DUMP = pathlib.Path(__file__).parents[1] / "support" / "env_dump.py"


def ftsup_run(tmp_path: pathlib.Path, *flags: str, script: pathlib.Path = SCRIPT,
              script_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], pathlib.Path]:
    run_dir = tmp_path / "run"
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "GRPC_VERBOSITY": "ERROR"}
    argv = [sys.executable, "-m", "ftsup.harness.cli", "run", "--run-dir", str(run_dir), "--json", *flags,
            str(script), *script_args]
    out = open(tmp_path / "stdout.txt", "wb")
    err = open(tmp_path / "stderr.txt", "wb")
    process = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=tmp_path, start_new_session=True)
    orphan_guard.watch(process)  # its whole session stopped even if pytest itself is killed
    return process, run_dir


def finish(process: subprocess.Popen[bytes], tmp_path: pathlib.Path, timeout_s: float = 240) -> dict:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        pytest.fail(f"ftsup run did not end; stderr:\n{(tmp_path / 'stderr.txt').read_text()[-4000:]}")
    lines = (tmp_path / "stdout.txt").read_text().splitlines()
    assert lines and lines[-1].startswith("{"), (tmp_path / "stderr.txt").read_text()[-4000:]
    return json.loads(lines[-1])


def script_args(tmp_path: pathlib.Path, steps: int, *extra: str) -> tuple[str, ...]:
    return ("--steps", str(steps), "--ckpt", str(tmp_path / "ckpt.pt"), "--marks", str(tmp_path / "marks"), *extra)


def pid_of(tmp_path: pathlib.Path, rank: int, restart: int) -> int:
    path = tmp_path / "marks" / f"pid.rank-{rank}.restart-{restart}"
    return wait_until(lambda: path.exists() and path.read_text() and int(path.read_text()), 120,
                      f"rank {rank} of restart {restart} to start")


def wait_trained_past(tmp_path: pathlib.Path, run_dir: pathlib.Path, node: str, rank: int, generation: int,
                      step: int) -> None:
    log = run_dir / "nodes" / node / f"rank-{rank}.gen-{generation}.log"
    wait_until(lambda: log.exists() and f"step {step} " in log.read_text(), 120,
               f"rank {rank} of generation {generation} to train past step {step}")


def starts(tmp_path: pathlib.Path, rank: int) -> list[tuple[int, int]]:
    text = (tmp_path / "marks" / f"starts.rank-{rank}").read_text()
    return [(int(a), int(b)) for a, b in (line.split() for line in text.splitlines())]


def test_a_killed_rank_and_a_lost_node_resume_from_the_scripts_own_checkpoint_on_a_spare(tmp_path):
    process, run_dir = ftsup_run(
        tmp_path, "--nproc-per-node", "2", "--nnodes", "2", "--local-nodes", "--spares", "1",
        "--max-restarts", "3", "--log-dir", str(tmp_path / "logs"),
        script_args=script_args(tmp_path, 24, "--save-every", "3", "--step-s", "0.25"))
    try:
        # (a) one rank SIGKILLed mid-run: the gang restarts and resumes from the script's checkpoint
        wait_trained_past(tmp_path, run_dir, "node-1", 1, 1, 4)
        os.kill(pid_of(tmp_path, 1, 0), signal.SIGKILL)
        # (c) then a whole simulated node (its agent and ranks) vanishes: the spare takes its ranks
        pid_of(tmp_path, 3, 1)
        wait_trained_past(tmp_path, run_dir, "node-2", 3, 2, 10)
        nodes = json.loads((run_dir / "run.json").read_text())["nodes"]
        os.killpg(nodes["node-2"]["pgid"], signal.SIGKILL)
        outcome = finish(process, tmp_path)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
    assert outcome["exit_code"] == 0 and process.returncode == 0 and outcome["phase"] == "completed"
    assert outcome["restarts"] == 2
    assert json.loads((tmp_path / "marks" / "done.json").read_text()) == {"step": 24, "restart": 2}
    resumed = starts(tmp_path, 0)
    assert [r for r, _ in resumed] == [0, 1, 2] and resumed[0][1] == 0
    assert resumed[1][1] >= 3 and resumed[2][1] >= 9  # from its own checkpoint, never from step 0 again
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    started = [e for e in events if e["kind"] == "generation_started"]
    assert {m["node_id"] for m in started[-1]["members"]} == {"node-1", "spare-1"}
    ended = [e for e in events if e["kind"] == "generation_ended"]
    assert [e["reason"] for e in ended] == ["END_REASON_TRAINER_EXITED", "END_REASON_NODE_LOST", "END_REASON_COMPLETED"]
    out = (tmp_path / "stdout.txt").read_text()
    assert "[rank 3]:step 24 " in out and "[rank 0]:restart 2: resuming at step" in out
    assert (tmp_path / "logs" / "rank-1.gen-1.log").read_text().startswith("restart 0: resuming at step 0")


def test_past_max_restarts_the_job_fails_naming_the_rank_its_exit_and_its_traceback(tmp_path):
    process, run_dir = ftsup_run(
        tmp_path, "--nproc-per-node", "2", "--max-restarts", "1",
        script_args=script_args(tmp_path, 30, "--raise-on-restart", "1", "--step-s", "0.2"))
    try:
        wait_trained_past(tmp_path, run_dir, "node-1", 1, 1, 2)
        os.kill(pid_of(tmp_path, 1, 0), signal.SIGKILL)  # restart 1 of 1; then rank 0 raises
        outcome = finish(process, tmp_path)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
    assert process.returncode == 1 and outcome["phase"] == "failed" and outcome["restarts"] == 1
    failed = outcome["failure"]
    assert failed["kind"] == "job_failed" and failed["cause"] == "END_REASON_TRAINER_EXITED"
    # Python exits 1 on the ValueError, unless gloo's threads abort the teardown of the still-live
    # process group first ("terminate called without an active exception": SIGABRT), a torch race
    # DEPENDENCIES.md records; either way the record names the rank, its exit and its traceback.
    assert (failed["rank"], failed["node_id"]) == (0, "node-1")
    assert failed["exit_code"] in (1, -signal.SIGABRT), failed
    assert "Traceback (most recent call last)" in failed["output_tail"]
    assert "ValueError: bad batch at step" in failed["output_tail"]
    assert len(failed["output_tail"].encode()) <= 4096
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events if e["kind"] in ("job_failed", "job_completed")] == ["job_failed"]
    first_end = next(e for e in events if e["kind"] == "generation_ended")
    assert (first_end["rank"], first_end["exit_code"]) == (1, -signal.SIGKILL)
    assert "ValueError: bad batch" in (tmp_path / "stderr.txt").read_text()  # said to the person, too


def test_ranks_see_torchruns_variables_with_torchruns_values(tmp_path):
    shape = ("--nproc-per-node", "2", "--max-restarts", "0")
    parent = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), GRPC_VERBOSITY="ERROR")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "torchrun").mkdir()
    parent_keys = tmp_path / "parent_keys.json"
    parent_keys.write_text(json.dumps(sorted(parent)))
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", *shape, str(DUMP),
                    str(parent_keys), str(tmp_path / "torchrun")], env=parent, check=True, timeout=120,
                   cwd=tmp_path, capture_output=True)
    process, _ = ftsup_run(tmp_path, "--standalone", *shape, script=DUMP,
                           script_args=(str(parent_keys), str(tmp_path / "ftsup")))
    assert finish(process, tmp_path, timeout_s=120)["exit_code"] == 0
    for rank in (0, 1):
        torchrun = json.loads((tmp_path / "torchrun" / f"rank-{rank}.json").read_text())
        ours = json.loads((tmp_path / "ftsup" / f"rank-{rank}.json").read_text())
        ftsup_only = {k for k in ours if k.startswith("FTSUP_")} | {"PYTHONUNBUFFERED"}
        assert set(ours) - ftsup_only == set(torchrun), (sorted(set(ours) ^ set(torchrun)))
        # Ports, the run id and the error file's path differ by nature; the store host by design.
        differ = {"MASTER_PORT", "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
                  "TORCHELASTIC_USE_AGENT_STORE"}
        assert {k: v for k, v in ours.items() if k in torchrun and k not in differ} == \
            {k: v for k, v in torchrun.items() if k not in differ}
        assert ours["TORCHELASTIC_USE_AGENT_STORE"] == "False" and torchrun["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert ours["TORCHELASTIC_RUN_ID"] == "run"
        assert ours["argv"] == torchrun["argv"]
