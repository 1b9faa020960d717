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
