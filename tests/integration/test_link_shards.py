"""Link shards on three replicas, a real 3-member etcd cluster, real agents and real gloo training.

The followers hold the agents their rendezvous hash gives them (common/shard_map.py; the leader
holds none while a follower lives) and relay them to the leader. SIGKILLing a follower that holds agents mid-run: its agents re-home to their
next replica at their first reconnect, nobody is declared dead; restarted, the replica takes its
agents back once its relay is up; stopped (SIGSTOP) for longer than its nodes may be silent, its
quiet is counted as the shard's, not as theirs, and its agents, their pings unanswered, move to the
other follower; the job completes in its first generation. Followers that relay answer SERVING for agents on the standard health service.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import signal
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

AGENTS_SERVICE = "ftsup.v1.Supervisor"
STEPS = 400  # long enough that the killed replica comes back, and is stopped, while the job runs
HEARTBEAT_S = 2.0  # nodes are declared dead after 2 silent heartbeats: 4 s
STOP_S = 6.5  # a stopped shard: longer than its nodes may be silent, shorter than 2 x that


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=AGENTS_SERVICE), timeout=5).status
        except grpc.RpcError:
            return -1


def _welcomes(log_path: pathlib.Path) -> list[tuple[float, str]]:
    """(unix time, supervisor address) of each Welcome the agent got, oldest first."""
    found = []
    for _, record in json_lines(log_path):
        if record["event"] == "welcomed" and "supervisor" in record:
            at = datetime.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
            found.append((at, record["supervisor"]))
    return found


def _holder(log_path: pathlib.Path) -> str | None:
    welcomes = _welcomes(log_path)
    return welcomes[-1][1] if welcomes else None


def test_a_killed_follower_shards_agents_rehome_and_training_goes_on_without_a_death(
    tmp_path: pathlib.Path, etcd: EtcdCluster, etcd_prefix: str
) -> None:
    # Six agents over the two followers: the victim (the one holding more) holds at least three.
    spec = ClusterSpec(
        nodes=3, spares=3, ranks_per_node=1, trainer_argv=trainer_argv(sys.executable, STEPS, seed=7),
        supervisors=3, etcd_endpoints=tuple(etcd.endpoints.split(",")), etcd_prefix=etcd_prefix,
        heartbeat_interval_s=HEARTBEAT_S,
    )
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start()
        leader = cluster.wait_for(cluster.leader, 30, "a leader")
        agents = {node_id: node.log_path for node_id, node in cluster.agents.items()}
        # The leader holds none of them (common/shard_map.agent_holders): its followers hold all.
        holders = agent_holders(cluster.addresses, leader.address)
        assert leader.address not in holders
        expected = {node_id: shard_of(node_id, holders) for node_id in agents}
        # Every agent ends up on the replica its rendezvous hash names (directly, or after a move
        # once every replica's membership is known).
        cluster.wait_for(lambda: all(_holder(agents[n]) == home for n, home in expected.items()), 60,
                         f"each agent on its shard {expected}")
        cluster.wait_for(lambda: cluster.status().step >= 5, 180, "step 5")
        followers = [a for a in cluster.addresses if a != leader.address]
        for follower in followers:
            if any(home == follower for home in expected.values()):
                cluster.wait_for(lambda f=follower: _health(f) == health_pb2.HealthCheckResponse.SERVING, 10,
                                 f"the relaying follower {follower} to answer SERVING for agents")
        victim = max(followers, key=lambda f: sum(home == f for home in expected.values()))
        moved = sorted(n for n, home in expected.items() if home == victim)
        assert moved, f"no follower holds an agent (placement {expected}): the test cannot kill a shard"
        step_at_kill = cluster.status().step
        killed_at = time.time()
        cluster.kill_supervisor(victim)

        survivors = [a for a in cluster.addresses if a != victim]
        rehomed = cluster.wait_for(
            lambda: (homes := {n: _welcomes(agents[n])[-1] for n in moved}) and all(
                at > killed_at and address in survivors for at, address in homes.values()) and homes,
            30, f"agents {moved} of the killed shard {victim} to re-home")
        for node_id, (_, address) in rehomed.items():
            assert address == shard_of(node_id, agent_holders(survivors, leader.address)), \
                f"{node_id} re-homed to the other follower, not to the leader"
        rehome_s = max(at for at, _ in rehomed.values()) - killed_at
        cluster.wait_for(lambda: cluster.status().step >= step_at_kill + 5, 120, "training to go on")

        # The replica comes back: once its relay is up it rejoins the live set and its nodes move
        # back to it (from the other shard), still without a death.
        returned_at = time.time()
        cluster.restart_supervisor(victim)
        cluster.wait_for(lambda: all(_holder(agents[n]) == victim for n in moved), 60,
                         f"agents {moved} to move back to the restarted {victim}")
        assert all(_welcomes(agents[n])[-1][0] > returned_at for n in moved)
        assert all(_holder(agents[n]) == home for n, home in expected.items()), "the others stay"
        step_back = cluster.status().step
        assert step_back < STEPS, "the job must still run when the replica returns (make STEPS larger)"
        cluster.wait_for(lambda: cluster.status().step >= step_back + 3, 120, "training to go on after the return")

        # The same shard stops (SIGSTOP: a host gone without a reset looks the same to its agents)
        # for longer than its nodes may be silent: the leader hears neither them nor the shard's
        # keepalives and counts the silence as the shard's; its agents' pings go unanswered and
        # they move to the other follower (agent/link.py: keepalive_options); nobody dies.
        stopped = cluster.replicas[victim]
        stopped_at = time.time()
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            time.sleep(STOP_S)  # (the fault itself: a stopped process for a set time)
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        left = {n: [at for at, address in _welcomes(agents[n]) if at > stopped_at and address != victim] for n in moved}
        assert all(left.values()), f"agents of the stopped shard welcomed elsewhere: {left}"
        left_s = max(min(ats) for ats in left.values()) - stopped_at
        assert left_s < STOP_S, f"the agents moved only after the shard woke ({left_s:.2f}s)"
        step_resumed = cluster.status().step
        cluster.wait_for(lambda: cluster.status().step >= step_resumed + 3, 120, "training to go on after the stop")
        quiet = [record for index in range(1, 4)
                 for _, record in json_lines(tmp_path / f"supervisor-{index}.log")
                 if record["event"] == "no liveness summary from the link shard for a while"
                 and record.get("replica") == victim]
        assert quiet and max(r["quiet_s"] for r in quiet) >= STOP_S - 0.5, quiet
        status = cluster.wait_for(
            lambda: (s := cluster.status()).phase == operator_pb2.JOB_PHASE_COMPLETED and s, 300, "completion")
        kinds = [r.event.WhichOneof("kind") for r in cluster.events()]
        assert kinds.count("generation_started") == 1, "a shard's death must not restart the job"
        assert "node_declared_dead" not in kinds, f"no false death (re-homed in {rehome_s:.2f}s)"
        assert status.step == STEPS and status.final_digest
        assert cluster.leader().address == leader.address, "a follower's death changes no leader"
        print(f"\nre-homed {len(moved)} agents in {rehome_s:.2f}s (killed), {left_s:.2f}s (stopped);"
              f" suspects: {kinds.count('node_suspected')}")
    for index in range(1, 4):  # every replica's node lines (the shards' too) name the generation in force
        assert supervisor_problems(json_lines(tmp_path / f"supervisor-{index}.log")) == [], index
