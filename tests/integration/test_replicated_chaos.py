"""Chaos on the replicated control plane, with real processes: etcd members lost, and a node that
dies while the supervisors are electing a new leader.

Three supervisor replicas on the session's real 3-member etcd cluster, agents, gloo trainers.
What must hold: the training job never restarts because of the control plane; with a majority of
etcd gone nobody decides (no replica can prove it leads) while trainers keep stepping, and on
recovery nothing acknowledged is lost; a node death that coincides with a failover is judged by
the new leader, once.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

from ftsup.harness.cluster import ClusterSpec, LocalCluster
from ftsup.harness.demo import trainer_argv
from ftsup.v1 import events_pb2, operator_pb2
from tests.support.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.integration


def of_kind(records: list[events_pb2.Record], kind: str) -> list:
    return [getattr(r.event, kind) for r in records if r.event.WhichOneof("kind") == kind]


def replicated(etcd: EtcdCluster, prefix: str, steps: int, spares: int) -> ClusterSpec:
    return ClusterSpec(
        nodes=3, spares=spares, ranks_per_node=1, trainer_argv=trainer_argv(sys.executable, steps, seed=5),
        supervisors=3, etcd_endpoints=tuple(etcd.endpoints.split(",")), etcd_prefix=prefix,
        warm_trainers=1 if spares else 0,
    )


def wait_completed(cluster: LocalCluster) -> operator_pb2.GetStatusResponse:
    return cluster.wait_for(
        lambda: (s := cluster.status()).phase == operator_pb2.JOB_PHASE_COMPLETED and s, 240, "the job to complete"
    )


def test_losing_etcd_members_degrades_the_control_plane_but_never_the_training(
    tmp_path: pathlib.Path, etcd: EtcdCluster, etcd_prefix: str
) -> None:
    with LocalCluster(replicated(etcd, etcd_prefix, 250, spares=0), tmp_path) as cluster:
        cluster.start()
        cluster.wait_for(lambda: cluster.status().step >= 3, 180, "step 3")
        cluster.wait_for(cluster.leader, 30, "a leader")
        acknowledged = [r.seq for r in cluster.events()]

        # One member lost (the raft leader, the harder case): a majority remains.
        etcd.kill(etcd.leader_name())
        step = cluster.trainer_step("node-1")
        cluster.wait_for(
            lambda: cluster.leader() is not None and cluster.trainer_step("node-1") >= step + 3, 60,
            "training and a leader with one etcd member down",
        )

        # A second member lost: no quorum, so no replica can prove it leads and nothing is decided.
        etcd.kill(next(m.name for m in etcd.members if m.is_running))
        cluster.wait_for(lambda: cluster.leader() is None, 30, "the leader to stop leading without an etcd quorum")
        step = cluster.trainer_step("node-1")
        cluster.wait_for(
            lambda: cluster.trainer_step("node-1") >= step + 5, 60, "training to go on while nobody leads"
        )
        assert cluster.leader() is None, "a replica claimed leadership without an etcd quorum"

        etcd.heal()
        cluster.wait_for(cluster.leader, 60, "a leader once the quorum is back")
        status = wait_completed(cluster)
        records = cluster.events()
        kinds = [r.event.WhichOneof("kind") for r in records]
        assert kinds.count("generation_started") == 1, "losing etcd must not restart the job"
        assert "node_declared_dead" not in kinds, "no node may be judged while nobody can decide"
        assert [r.seq for r in records] == list(range(1, len(records) + 1)), "gapless"
        assert [r.seq for r in records][: len(acknowledged)] == acknowledged, "nothing acknowledged was lost"
        assert status.step == 250 and status.final_digest


def test_a_node_that_dies_during_a_leader_failover_is_replaced_exactly_once(
    tmp_path: pathlib.Path, etcd: EtcdCluster, etcd_prefix: str
) -> None:
    with LocalCluster(replicated(etcd, etcd_prefix, 120, spares=1), tmp_path) as cluster:
        cluster.start()
        cluster.wait_for(lambda: cluster.status().step >= 3, 180, "step 3")
        first = cluster.wait_for(cluster.leader, 30, "a leader")
        acknowledged = [r.seq for r in cluster.events()]

        cluster.kill_supervisor(first.address)
        cluster.kill_node("node-2")  # while no replica leads: only the next leader can notice
        second = cluster.wait_for(
            lambda: (leader := cluster.leader()) is not None and leader.address != first.address and leader,
            30, "a new leader",
        )
        assert second.term > first.term
        status = wait_completed(cluster)

        records = cluster.events()
        dead = of_kind(records, "node_declared_dead")
        assert [d.node_id for d in dead] == ["node-2"], "judged once, by the new leader"
        assert all(r.term == second.term for r in records if r.event.WhichOneof("kind") == "node_declared_dead")
        assert [q.node_id for q in of_kind(records, "node_quarantined")] == ["node-2"]
        generations = of_kind(records, "generation_started")
        assert len(generations) == 2, "replaced exactly once"
        assert [m.node_id for m in generations[-1].members] == ["node-1", "spare-1", "node-3"]
        assert [r.seq for r in records] == list(range(1, len(records) + 1)), "gapless"
        assert [r.seq for r in records][: len(acknowledged)] == acknowledged, "nothing acknowledged was lost"
        assert status.step == 120 and status.final_digest
