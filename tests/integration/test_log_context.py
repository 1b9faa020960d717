"""Every log line about a node names the node and its generation, in a real cluster run.

A supervisor, two agents and a spare at debug level train a few steps; one node is killed, the spare
replaces it and the job completes. Every JSON line the daemons wrote is then read back: the
supervisor's node-related lines must carry the generation in force as they were written, every
agent line its own node id and a generation key (set on any line that names a rank).
"""

from __future__ import annotations

import pathlib
import sys

import pytest

from ftsup.harness.cluster import ClusterSpec, LocalCluster
from ftsup.harness.demo import trainer_argv
from ftsup.v1 import operator_pb2
from tests.support.log_context import agent_problems, json_lines, supervisor_problems

pytestmark = pytest.mark.integration

STEPS = 10


def test_every_line_about_a_node_names_the_node_and_the_generation_through_a_failure(tmp_path: pathlib.Path) -> None:
    spec = ClusterSpec(
        nodes=2, spares=1, ranks_per_node=1, trainer_argv=trainer_argv(sys.executable, STEPS, seed=3),
        heartbeat_interval_s=0.5, reconnect_grace_s=1.0,
        agent_args=("--log-level", "debug"), supervisor_args=("--log-level", "debug"),
    )
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start()
        cluster.wait_for(lambda: cluster.status().step >= 3, 180, "step 3")
        cluster.kill_node("node-2")
        cluster.wait_for(lambda: cluster.status().phase == operator_pb2.JOB_PHASE_COMPLETED, 240, "completion")
    supervisor = list(json_lines(tmp_path / "supervisor.log"))
    kinds = {r.get("kind") for _, r in supervisor if r["event"] == "event"}
    assert {"NodeDeclaredDead", "GenerationEnded", "JobCompleted"} <= kinds, "the run must cover a failure"
    assert sum(1 for _, r in supervisor if r["event"] == "node connected") >= 3
    assert supervisor_problems(supervisor) == []
    for node_id in ("node-1", "node-2", "spare-1"):
        lines = list(json_lines(tmp_path / "nodes" / node_id / "agent.log"))
        assert any(r["event"] == "trainer_started" for _, r in lines), f"{node_id} never trained"
        assert agent_problems(node_id, lines) == [], node_id
    restored = [r for _, r in json_lines(tmp_path / "nodes" / "spare-1" / "agent.log") if r["event"] == "restore_ready"]
    assert restored and all(r["generation"] == 2 for r in restored)
