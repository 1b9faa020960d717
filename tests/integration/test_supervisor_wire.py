"""Bad input at the supervisor's wire, against a real supervisor process: refused, never a crash."""

from __future__ import annotations

import json
import math
import pathlib
import queue
import select
import subprocess
import sys
import threading
from collections.abc import Iterator

import grpc
import pytest

from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2
from harness.cluster import ClusterSpec, LocalCluster

pytestmark = pytest.mark.integration


class RawAgent:
    """A hand-driven agent stream: send any message, read what the supervisor answers."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self._outgoing: queue.Queue[agent_pb2.AgentMessage | None] = queue.Queue()
        self._replies = agent_pb2_grpc.SupervisorStub(self._channel).Connect(self._requests())
        self.received: queue.Queue[agent_pb2.SupervisorMessage] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _requests(self) -> Iterator[agent_pb2.AgentMessage]:
        while (message := self._outgoing.get()) is not None:
            yield message

    def _pump(self) -> None:
        try:
            for reply in self._replies:
                self.received.put(reply)
        except grpc.RpcError:
            pass

    def send(self, **kind: object) -> None:
        self._outgoing.put(agent_pb2.AgentMessage(**kind))

    def next_of(self, kind: str, timeout: float = 10.0) -> agent_pb2.SupervisorMessage:
        while True:
            reply = self.received.get(timeout=timeout)
            if reply.WhichOneof("kind") == kind:
                return reply

    def close(self) -> None:
        self._outgoing.put(None)
        self._channel.close()


def hello(node_id: str, incarnation: int) -> agent_pb2.Hello:
    return agent_pb2.Hello(node_id=node_id, incarnation=incarnation, role=events_pb2.NODE_ROLE_ACTIVE,
                           host="127.0.0.1", peer_port=9, gpus=0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Two nodes wanted, none started by the harness: the test plays the agents itself.
    spec = ClusterSpec(nodes=2, spares=0, ranks_per_node=1, trainer_argv=("true",))
    cluster = LocalCluster(spec, tmp_path_factory.mktemp("wire"))
    with cluster:
        cluster.start_supervisor_only()
        yield cluster


def test_a_message_before_hello_is_refused(cluster: LocalCluster) -> None:
    agent = RawAgent(cluster.address)
    agent.send(heartbeat=agent_pb2.Heartbeat(seq=1))
    refusal = agent.next_of("refusal").refusal
    assert "first message on a stream must be Hello" in refusal.reason
    agent.close()


def test_a_duplicate_node_id_is_refused_and_the_first_agent_keeps_its_place(cluster: LocalCluster) -> None:
    first = RawAgent(cluster.address)
    first.send(hello=hello("dup-1", 1))
    assert first.next_of("welcome").welcome.node_id == "dup-1"
    second = RawAgent(cluster.address)
    second.send(hello=hello("dup-1", 2))
    assert "duplicate node id 'dup-1'" in second.next_of("refusal").refusal.reason
    nodes = {n.node_id: n for n in cluster.nodes()}
    assert nodes["dup-1"].incarnation == 1 and nodes["dup-1"].connected
    first.close()
    second.close()


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        (agent_pb2.StepReport(generation=1, rank=0, step=1, step_time_s=math.nan), "step_time_s=nan"),
        (agent_pb2.StepReport(generation=1, rank=0, step=1, step_time_s=-3.0), "step_time_s=-3.0"),
        (agent_pb2.StepReport(generation=99, rank=0, step=1, step_time_s=0.1, compute_time_s=0.05), "stale generation 99"),
    ],
)
def test_bad_step_reports_are_refused_and_the_supervisor_keeps_serving(
    cluster: LocalCluster, report: agent_pb2.StepReport, reason: str
) -> None:
    agent = RawAgent(cluster.address)
    agent.send(hello=hello("reporter", 7))
    agent.next_of("welcome")
    agent.send(step_report=report)
    assert reason in agent.next_of("refusal").refusal.reason
    assert cluster.status().head_seq >= 1  # still answering
    agent.close()


def test_a_real_agent_with_a_taken_node_id_exits_with_code_2(cluster: LocalCluster, tmp_path: pathlib.Path) -> None:
    holder = RawAgent(cluster.address)
    holder.send(hello=hello("taken", 1))
    holder.next_of("welcome")
    result = subprocess.run(
        [sys.executable, "-m", "agent", "--node-id", "taken", "--supervisor", cluster.address,
         "--workdir", str(tmp_path), "--no-log-json"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "duplicate node id 'taken'" in result.stderr
    holder.close()


def test_a_second_supervisor_on_the_same_event_log_refuses_to_start(cluster: LocalCluster) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "supervisor", "--listen", "127.0.0.1:0", "--data-dir",
         str(cluster.workdir / "supervisor"), "--job", str(cluster.workdir / "job.json"), "--no-log-json"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "in use by another process" in result.stderr


def test_events_follow_streams_records_as_they_are_appended(cluster: LocalCluster) -> None:
    head = cluster.status().head_seq
    follower = subprocess.Popen(
        [sys.executable, "-m", "supervisor.ctl.main", "--address", cluster.address, "events", "--follow",
         "--json", "--since", str(head + 1)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        agent = RawAgent(cluster.address)
        agent.send(hello=hello("follow-me", 5))
        agent.next_of("welcome")
        assert follower.stdout is not None
        ready, _, _ = select.select([follower.stdout], [], [], 30)  # the deadline, not a sleep
        assert ready, "supervisorctl events --follow printed nothing within 30 s"
        line = follower.stdout.readline()
        record = json.loads(line)
        assert record["seq"] == head + 1 and record["kind"] == "node_registered"
        assert record["node_id"] == "follow-me"
        agent.close()
    finally:
        follower.kill()
        follower.wait(timeout=10)
