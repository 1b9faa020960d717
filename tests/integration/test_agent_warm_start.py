"""Pre-warmed trainer processes: a warm process becomes the trainer it is told to be."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ftsup.agent.warm_pool import is_warmable

pytestmark = pytest.mark.integration

SCRIPT = """
import json, os, sys
json.dump({"argv": sys.argv, "rank": os.environ.get("RANK"), "leak": os.environ.get("AGENT_ONLY"),
           "name": __name__, "torch_loaded": "torch" in sys.modules}, open(os.environ["OUT"], "w"))
print("hello from the trainer")
sys.exit(3)
"""


@pytest.mark.parametrize("as_module", [False, True], ids=["script", "module"])
def test_a_warm_process_runs_the_trainer_with_its_argv_env_log_and_exit_code(tmp_path: pathlib.Path, as_module):
    script = tmp_path / "fake_trainer.py"
    script.write_text(SCRIPT)
    out, log = tmp_path / "out.json", tmp_path / "rank.log"
    argv = [sys.executable, "-m", "fake_trainer", "--steps", "5"] if as_module else [sys.executable, str(script), "--steps", "5"]
    env = {"RANK": "3", "OUT": str(out), "PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]}
    warm = subprocess.Popen([sys.executable, "-m", "ftsup.agent.warm_start"], stdin=subprocess.PIPE,
                            env={**os.environ, "AGENT_ONLY": "secret"}, cwd=tmp_path)
    warm.communicate(json.dumps({"argv": argv, "env": env, "log_path": str(log)}).encode() + b"\n", timeout=120)
    assert warm.returncode == 3
    seen = json.loads(out.read_text())
    assert seen["argv"][1:] == ["--steps", "5"] and seen["rank"] == "3" and seen["name"] == "__main__"
    assert seen["leak"] is None, "the agent's environment must not leak into the trainer"
    assert seen["torch_loaded"], "torch was imported before the launch"
    assert "hello from the trainer" in log.read_text()


def test_a_warm_process_exits_quietly_when_the_pool_closes(tmp_path: pathlib.Path):
    warm = subprocess.Popen([sys.executable, "-m", "ftsup.agent.warm_start"], stdin=subprocess.PIPE, cwd=tmp_path)
    warm.communicate(b"", timeout=120)
    assert warm.returncode == 0


def test_only_this_interpreter_running_a_module_or_script_is_warmable():
    assert is_warmable([sys.executable, "-m", "ftsup.trainer.examples.gpt"])
    assert is_warmable([sys.executable, "train.py", "--lr", "1"])
    assert not is_warmable([sys.executable, "-u", "train.py"])
    assert not is_warmable(["/usr/bin/env", "python", "train.py"])
    assert not is_warmable(["/bin/sh", "-c", "python train.py"])
    assert not is_warmable([sys.executable])


RANK0_SCRIPT = """
import os, pathlib, sys
import torch, torch.distributed as dist
go = pathlib.Path(os.environ["GO"])
while not go.exists():  # the test dials the store meanwhile: it must already listen
    pass
dist.init_process_group("gloo")  # rank 0's own store: the multi-tenant one started at the launch
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
pathlib.Path(os.environ["OUT"]).write_text(str(t.item()))
dist.destroy_process_group()
"""

RANK1 = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t.item() == 3.0, t
dist.destroy_process_group()
"""


def test_a_warm_rank_0_listens_for_the_other_ranks_before_its_script_calls_init(tmp_path: pathlib.Path):
    """Rank 0's rendezvous store starts at the launch (common/rendezvous_store.py), so the other
    ranks' first dial finds it and nobody sits in torch's connect back-off; the script's own
    init_process_group then uses that store (a second server on the port would fail to bind)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from ftsup.harness.cluster import free_port, wait_until

    script, out, go = tmp_path / "rank0.py", tmp_path / "out.txt", tmp_path / "go"
    script.write_text(RANK0_SCRIPT)
    port = free_port()
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OUT": str(out), "GO": str(go), "PATH": os.environ["PATH"], "TORCHELASTIC_USE_AGENT_STORE": "False"}
    warm = subprocess.Popen([sys.executable, "-m", "ftsup.agent.warm_start"], stdin=subprocess.PIPE, cwd=tmp_path)
    rank1 = None
    try:
        assert warm.stdin is not None
        warm.stdin.write(json.dumps({"argv": [sys.executable, str(script)], "env": env,
                                     "log_path": str(tmp_path / "rank0.log")}).encode() + b"\n")
        warm.stdin.close()

        def dial() -> bool:
            try:
                probe = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=1), wait_for_workers=False)
            except Exception:
                return False
            probe.set("probe", "seen")  # a real round trip to the server, not just a connect
            return True

        wait_until(dial, 60, "rank 0's store to listen while its script waits")
        rank1 = subprocess.Popen([sys.executable, "-c", RANK1], env={**env, "RANK": "1"})
        go.write_text("")
        assert rank1.wait(timeout=120) == 0
        assert warm.wait(timeout=120) == 0, (tmp_path / "rank0.log").read_text()
        assert out.read_text() == "3.0"
    finally:
        for process in (warm, rank1):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
