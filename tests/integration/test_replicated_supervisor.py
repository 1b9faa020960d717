"""Three supervisor replicas on a real 3-member etcd cluster, real agents, real gloo training.

Killing the leading supervisor mid-run: a follower takes over within seconds, at a higher term,
agents reconnect to it, and training never stops: the job completes in its first generation.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from ftsup.v1 import operator_pb2
from harness.cluster import ClusterSpec, LocalCluster
from harness.demo import trainer_argv
from tests.support.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.integration


def test_killing_the_leading_supervisor_neither_stops_training_nor_loses_an_event(
    tmp_path: pathlib.Path, etcd: EtcdCluster, etcd_prefix: str
) -> None:
    spec = ClusterSpec(
        nodes=3, spares=1, ranks_per_node=1, trainer_argv=trainer_argv(sys.executable, 80, seed=5),
        supervisors=3, etcd_endpoints=tuple(etcd.endpoints.split(",")), etcd_prefix=etcd_prefix,
        warm_trainers=1,
    )
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start()
        cluster.wait_for(lambda: cluster.status().step >= 5, 180, "step 5")
        first = cluster.wait_for(cluster.leader, 30, "a leader")
        before = [r.seq for r in cluster.events()]
        cluster.kill_supervisor(first.address)
        second = cluster.wait_for(
            lambda: (leader := cluster.leader()) is not None and leader.address != first.address and leader,
            30, "a new leader",
        )
        assert second.term > first.term
        status = cluster.wait_for(
            lambda: (s := cluster.status()).phase == operator_pb2.JOB_PHASE_COMPLETED and s, 240, "completion"
        )
        records = cluster.events()
        kinds = [r.event.WhichOneof("kind") for r in records]
        assert kinds.count("generation_started") == 1, "a supervisor failover must not restart the job"
        assert "node_declared_dead" not in kinds, "agents must survive the failover (one timeout of grace)"
        assert [r.seq for r in records] == list(range(1, len(records) + 1)), "gapless"
        assert [r.seq for r in records][: len(before)] == before, "nothing acknowledged was lost"
        assert {r.term for r in records} >= {first.term, second.term}
        assert status.step == 80 and status.final_digest

        ctl = subprocess.run([sys.executable, "-m", "supervisor.ctl.main", "--address", ",".join(cluster.addresses),
                              "leader", "--json"], capture_output=True, text=True, timeout=60)
        assert ctl.returncode == 0, ctl.stderr
        assert f'"leader": "{second.address}"' in ctl.stdout
