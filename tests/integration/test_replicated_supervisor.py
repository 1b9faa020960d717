"""Three supervisor replicas on a real 3-member etcd cluster, real agents, real gloo training.

Killing the leading supervisor mid-run: a follower takes over within seconds, at a higher term,
and training never stops: the job completes in its first generation. The agents held by the
follower that goes on following keep their streams: it replays their Hellos to the new leader,
which welcomes them through the same stream (no reconnect); the new leader's own share reconnects.
The standard health service tells a load balancer which replica takes agents: the leader only.
"""

from __future__ import annotations

import datetime
import pathlib
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ftsup.common.shard_map import agent_holders, shard_of
from ftsup.harness.cluster import ClusterSpec, LocalCluster
from ftsup.harness.demo import trainer_argv
from ftsup.v1 import operator_pb2
from tests.support.etcd_cluster import EtcdCluster
from tests.support.log_context import json_lines, supervisor_problems

pytestmark = pytest.mark.integration


def _events(log_path: pathlib.Path) -> list[tuple[float, dict]]:
    """(unix time, record) of each line of an agent's JSON log."""
    out = []
    for _, record in json_lines(log_path):
        at = datetime.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
        out.append((at, record))
    return out


def _last(log_path: pathlib.Path, event: str) -> dict:
    """The newest record of `event` with its time as "at"; {} when there is none."""
    found = [{**record, "at": at} for at, record in _events(log_path) if record["event"] == event]
    return found[-1] if found else {}


def test_killing_the_leading_supervisor_neither_stops_training_nor_loses_an_event(
    tmp_path: pathlib.Path, etcd: EtcdCluster, etcd_prefix: str
) -> None:
    spec = ClusterSpec(
        nodes=3, spares=3, ranks_per_node=1, trainer_argv=trainer_argv(sys.executable, 80, seed=5),
        supervisors=3, etcd_endpoints=tuple(etcd.endpoints.split(",")), etcd_prefix=etcd_prefix,
        warm_trainers=1,
    )
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start()
        cluster.wait_for(lambda: cluster.status().step >= 5, 180, "step 5")
        first = cluster.wait_for(cluster.leader, 30, "a leader")
        logs = {node_id: node.log_path for node_id, node in cluster.agents.items()}
        homes = {node_id: shard_of(node_id, agent_holders(cluster.addresses, first.address)) for node_id in logs}
        cluster.wait_for(lambda: all(_last(logs[n], "welcomed").get("supervisor") == homes[n] for n in logs), 60,
                         f"each agent on its shard {homes}")
        before = [r.seq for r in cluster.events()]
        killed_at = time.time()
        cluster.kill_supervisor(first.address)
        second = cluster.wait_for(
            lambda: (leader := cluster.leader()) is not None and leader.address != first.address and leader,
            30, "a new leader",
        )
        assert second.term > first.term
        # The follower that goes on following keeps its agents: welcomed again on the same stream.
        kept = sorted(n for n, home in homes.items() if home not in (first.address, second.address))
        cluster.wait_for(lambda: all(_last(logs[n], "welcomed_again").get("at", 0) > killed_at for n in kept), 30,
                         f"agents {kept} welcomed by the new leader through their kept streams")
        for node_id in kept:
            ended = [r for at, r in _events(logs[node_id]) if at > killed_at
                     and r["event"] in ("stream_closed_by_supervisor", "stream_error", "redirected")]
            assert not ended, f"{node_id}'s stream was kept: {ended}"
        print(f"\nkept {len(kept)} of {len(logs)} agents' streams across the leader change (placement {homes})")
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

        ctl = subprocess.run([sys.executable, "-m", "ftsup.supervisor.ctl.main", "--address", ",".join(cluster.addresses),
                              "leader", "--json"], capture_output=True, text=True, timeout=60)
        assert ctl.returncode == 0, ctl.stderr
        assert f'"leader": "{second.address}"' in ctl.stdout
    for index in range(1, 4):  # the new leader's node lines name the generation it took over
        assert supervisor_problems(json_lines(tmp_path / f"supervisor-{index}.log")) == [], index


def test_a_paused_leader_is_fenced_when_it_wakes_and_steps_down_to_follow(
    tmp_path: pathlib.Path, etcd: EtcdCluster, etcd_prefix: str
) -> None:
    import os
    import signal

    spec = ClusterSpec(
        nodes=3, spares=0, ranks_per_node=1, trainer_argv=trainer_argv(sys.executable, 400, seed=5),
        supervisors=3, etcd_endpoints=tuple(etcd.endpoints.split(",")), etcd_prefix=etcd_prefix,
    )
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start()
        cluster.wait_for(lambda: cluster.status().step >= 3, 180, "step 3")
        first = cluster.wait_for(cluster.leader, 30, "a leader")
        paused = cluster.replicas[first.address]
        os.killpg(paused.pid, signal.SIGSTOP)  # longer than the 2 s lease
        try:
            second = cluster.wait_for(
                lambda: (leader := cluster.leader_excluding(first.address)) is not None and leader, 30, "a new leader"
            )
        finally:
            os.killpg(paused.pid, signal.SIGCONT)
        assert second.term > first.term
        woke = cluster.wait_for(
            lambda: (r := cluster.replica_view(first.address)) is not None and not r.is_leader
            and r.leader_address == second.address and r, 30, "the woken replica to follow the new leader",
        )
        assert woke.term <= second.term
        records = cluster.events()
        after_new_term = [r for r in records if r.term == second.term]
        if after_new_term:
            first_new = after_new_term[0].seq
            assert all(r.term != first.term for r in records if r.seq > first_new), "a deposed leader appended"


AGENTS_SERVICE = "ftsup.v1.Supervisor"
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def health(address: str, service: str) -> int | None:
    """One replica's answer for a service; None when it does not answer."""
    try:
        with grpc.insecure_channel(address) as channel:
            request = health_pb2.HealthCheckRequest(service=service)
            return int(health_pb2_grpc.HealthStub(channel).Check(request, timeout=2).status)
    except grpc.RpcError:
        return None


def test_a_follower_answers_not_serving_for_agents_until_it_leads_while_every_replica_serves_reads(
    tmp_path: pathlib.Path, etcd: EtcdCluster, etcd_prefix: str
) -> None:
    # Without link shards (followers only redirect agents); with them, see test_link_shards.py.
    spec = ClusterSpec(nodes=1, spares=0, ranks_per_node=1, trainer_argv=("true",), supervisors=3,
                       etcd_endpoints=tuple(etcd.endpoints.split(",")), etcd_prefix=etcd_prefix,
                       supervisor_args=("--no-link-shards",))
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start_supervisor_only()  # no agents: leadership alone decides the answers
        first = cluster.wait_for(cluster.leader, 30, "a leader")
        followers = [a for a in cluster.addresses if a != first.address]
        expected = {first.address: SERVING, **{f: NOT_SERVING for f in followers}}
        cluster.wait_for(lambda: {a: health(a, AGENTS_SERVICE) for a in cluster.addresses} == expected, 10,
                         f"SERVING for agents on the leader {first.address} only")
        for address in cluster.addresses:  # any replica answers operators' reads
            assert health(address, "") == SERVING and health(address, "ftsup.v1.Operator") == SERVING

        cluster.kill_supervisor(first.address)
        second = cluster.wait_for(lambda: cluster.leader_excluding(first.address), 30, "a new leader")
        assert second.address in followers
        cluster.wait_for(lambda: health(second.address, AGENTS_SERVICE) == SERVING, 10,
                         f"the follower {second.address} to answer SERVING once it leads")
        (still_following,) = (f for f in followers if f != second.address)
        assert health(still_following, AGENTS_SERVICE) == NOT_SERVING

        cluster.restart_supervisor(first.address)  # the old leader comes back as a follower
        cluster.wait_for(lambda: health(first.address, "") == SERVING, 30, "the restarted replica")
        assert health(first.address, AGENTS_SERVICE) == NOT_SERVING
        assert health(second.address, AGENTS_SERVICE) == SERVING
