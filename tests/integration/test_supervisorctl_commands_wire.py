"""supervisorctl's job-wide commands against a real supervisor process over the wire."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from ftsup.harness.cluster import free_port, wait_until
from ftsup.v1 import agent_pb2
from tests.integration.test_supervisor_wire import RawAgent, ctl, hello

pytestmark = pytest.mark.integration


def wait_for(address: str, predicate, what: str, timeout_s: float = 30.0) -> dict:
    def status() -> dict | None:
        done = ctl(address, "status", "--json")
        if done.returncode == 0 and predicate(answer := json.loads(done.stdout)):
            return answer
        return None

    return wait_until(status, timeout_s, what, poll_s=0.2)


def test_restart_goodput_and_the_experiment_record_over_the_wire(tmp_path: pathlib.Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"name": "exp", "nodes": 1, "ranks_per_node": 1, "argv": ["true"],
                               "code_version": "git:feedbee", "data_version": "ds@1"}))
    port = free_port()
    address = f"127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "ftsup.supervisor", "--listen", address, "--data-dir", str(tmp_path / "log"),
         "--job", str(job), "--heartbeat-interval-s", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agent = None
    try:
        wait_for(address, lambda s: True, "the supervisor did not answer")
        agent = RawAgent(address)
        agent.send(hello=hello("exp-1", 1))
        agent.next_of("welcome")
        wait_for(address, lambda s: s["generation"] == 1, "generation 1 did not start")
        agent.send(step_report=agent_pb2.StepReport(generation=1, rank=0, step=1, step_time_s=0.1, compute_time_s=0.05))
        wait_for(address, lambda s: s["phase"] == "running", "generation 1 did not run")

        restarted = ctl(address, "restart", "--reason", "integration", "--json")
        assert restarted.returncode == 0, restarted.stderr
        assert "generation 2 restores from step 0" in json.loads(restarted.stdout)["detail"]

        report = json.loads(ctl(address, "goodput", "--json").stdout)
        assert report["generations"] == 2 and report["interruptions_by_reason"] == {"operator_restart": 1}
        assert report["wall_s"] > 0 and sum(report["buckets_s"].values()) == pytest.approx(report["wall_s"], rel=1e-6)
        assert report["lost_steps"] == 1  # step 1 was thrown away: generation 2 starts fresh

        at_step = json.loads(ctl(address, "events", "--at-step", "1", "--json").stdout)["generations"]
        assert [(g["generation"], g["kept"]) for g in at_step] == [(1, False), (2, True)]
        assert at_step[0]["started"]["code_version"] == "git:feedbee" and at_step[0]["started"]["data_version"] == "ds@1"
        assert len(at_step[0]["started"]["config_hash"]) == 64

        status = ctl(address, "status")
        assert status.returncode == 0 and "ETTR" in status.stdout
        for command in ("stragglers", "checkpoints"):
            done = ctl(address, command, "--json")
            assert done.returncode == 0 and json.loads(done.stdout), done.stderr
        refused = ctl(address, "checkpoint", "now", "--reason", "x")
        assert refused.returncode == 1 and "no checkpoint store is configured" in refused.stderr
    finally:
        if agent is not None:
            agent.close()
        process.terminate()
        process.wait(timeout=20)
