"""Pre-warmed trainer processes: a warm process becomes the trainer it is told to be."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ftsup.agent.warm_pool import is_warmable
from ftsup.harness.cluster import wait_until

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


PRELOADED = """
import json, os, threading
# Imported last of the preloads: written once torch is in. 0: the importing thread (nice is per thread).
json.dump({"nice": os.getpriority(os.PRIO_PROCESS, 0), "thread": threading.current_thread().name},
          open(os.environ["PROBE_OUT"], "w"))
"""

NICE_SCRIPT = """
import json, os, sys
json.dump({"trainer_nice": os.getpriority(os.PRIO_PROCESS, 0), "torch_loaded": "torch" in sys.modules},
          open(os.environ["OUT"], "w"))
"""


def test_a_refills_imports_run_at_the_lowest_priority_and_the_trainer_keeps_its_own(tmp_path: pathlib.Path):
    (tmp_path / "preloaded_probe.py").write_text(PRELOADED)
    script = tmp_path / "nice_trainer.py"
    script.write_text(NICE_SCRIPT)
    out, probe, log = tmp_path / "out.json", tmp_path / "probe.json", tmp_path / "rank.log"
    env = {"OUT": str(out), "PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]}
    own = os.getpriority(os.PRIO_PROCESS, 0)
    warm = subprocess.Popen([sys.executable, "-m", "ftsup.agent.warm_start", "--preload-nice", "19", "preloaded_probe"],
                            stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(tmp_path), "PROBE_OUT": str(probe)},
                            cwd=tmp_path)
    try:
        # The launch after the preload (one arriving during it gives the imports the trainer's
        # priority back where the process may: as root, always).
        wait_until(lambda: probe.exists() and probe.read_text().endswith("}"), 120.0, "the preload to finish")
        warm.communicate(json.dumps({"argv": [sys.executable, str(script)], "env": env, "log_path": str(log)}).encode()
                         + b"\n", timeout=120)
    finally:
        if warm.poll() is None:
            warm.kill()
            warm.wait(timeout=30)
    assert warm.returncode == 0, log.read_text()
    preload, seen = json.loads(probe.read_text()), json.loads(out.read_text())
    assert preload == {"nice": 19, "thread": "warm-preload"}
    assert seen["trainer_nice"] == own, "the trainer must keep the process's priority, not the refill's"
    assert seen["torch_loaded"], "torch was imported before the launch"


def test_the_preload_nice_flag_is_checked():
    from ftsup.agent.warm_start import parse_argv

    assert parse_argv(["--preload-nice", "19", "mod"]) == (19, ["mod"])
    assert parse_argv(["mod"]) == (None, ["mod"])
    for bad in (["--preload-nice"], ["--preload-nice", "high"], ["--preload-nice", "20"]):
        with pytest.raises(SystemExit):
            parse_argv(bad)
