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
import time
from collections.abc import Iterator

import grpc
import pytest

from ftsup.harness import orphan_guard
from ftsup.harness.cluster import ClusterSpec, LocalCluster
from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2

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
    # Two nodes wanted, none started by the harness: the test plays the agents itself. Its raw
    # agents never heartbeat: at the default 1 s interval they were declared dead 2 s after their
    # Hello, which a loaded machine's CLI runs outlast (a quarantine found the node already
    # quarantined for its silence); a long interval keeps them alive for the module.
    spec = ClusterSpec(nodes=2, spares=0, ranks_per_node=1, trainer_argv=("true",), heartbeat_interval_s=60.0)
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


def test_a_real_agent_with_a_taken_node_id_exits_with_code_3(cluster: LocalCluster, tmp_path: pathlib.Path) -> None:
    holder = RawAgent(cluster.address)
    holder.send(hello=hello("taken", 1))
    holder.next_of("welcome")
    result = subprocess.run(
        [sys.executable, "-m", "ftsup.agent", "--node-id", "taken", "--supervisor", cluster.address,
         "--workdir", str(tmp_path), "--no-log-json"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 3  # a PERMANENT refusal: refused for good
    assert "duplicate node id 'taken'" in result.stderr
    holder.close()


def test_a_second_supervisor_on_the_same_event_log_refuses_to_start(cluster: LocalCluster) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ftsup.supervisor", "--listen", "127.0.0.1:0", "--data-dir",
         str(cluster.workdir / "supervisor"), "--job", str(cluster.workdir / "job.json"), "--no-log-json"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "in use by another process" in result.stderr


def test_events_follow_streams_records_as_they_are_appended(cluster: LocalCluster) -> None:
    head = cluster.status().head_seq
    follower = subprocess.Popen(
        [sys.executable, "-m", "ftsup.supervisor.ctl.main", "--address", cluster.address, "events", "--follow",
         "--json", "--since", str(head + 1)],
        stdout=subprocess.PIPE, text=True,
    )
    orphan_guard.watch(follower)  # stopped even if pytest itself is killed
    try:
        agent = RawAgent(cluster.address)
        agent.send(hello=hello("follow-me", 5))
        agent.next_of("welcome")
        assert follower.stdout is not None
        # (earlier tests' closed streams may still be ending in records of their own: the first
        # record after `head` is not necessarily this one; every one printed is in order)
        seen: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while not any(r["kind"] == "node_registered" and r["node_id"] == "follow-me" for r in seen):
            ready, _, _ = select.select([follower.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"supervisorctl events --follow printed no registration of follow-me within 30 s: {seen}"
            seen.append(json.loads(follower.stdout.readline()))
        assert [r["seq"] for r in seen] == list(range(head + 1, head + 1 + len(seen))), "in order, none skipped"
        agent.close()
    finally:
        follower.kill()
        follower.wait(timeout=10)


def ctl(cluster_address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ftsup.supervisor.ctl.main", "--address", cluster_address, *args],
                          capture_output=True, text=True, timeout=60)


def test_operator_quarantine_and_unquarantine_over_the_wire(cluster: LocalCluster) -> None:
    agent = RawAgent(cluster.address)
    agent.send(hello=hello("op-target", 3))
    agent.next_of("welcome")
    done = ctl(cluster.address, "quarantine", "op-target", "--reason", "bad DIMM", "--operator", "alice", "--json")
    assert done.returncode == 0, done.stderr
    assert "NodeQuarantined" in json.loads(done.stdout)["detail"]
    nodes = {n.node_id: n for n in cluster.nodes()}
    assert nodes["op-target"].quarantined and nodes["op-target"].quarantine_reason == "quarantine by alice: bad DIMM"
    again = ctl(cluster.address, "quarantine", "op-target", "--reason", "again")
    assert again.returncode == 1 and "already quarantined" in again.stderr
    unknown = ctl(cluster.address, "drain", "nope", "--reason", "x")
    assert unknown.returncode == 2 and "unknown node 'nope'" in unknown.stderr
    back = ctl(cluster.address, "unquarantine", "op-target", "--reason", "DIMM replaced")
    assert back.returncode == 0 and "NodeUnquarantined" in back.stdout
    agent.close()


def start_supervisor(tmp_path: pathlib.Path, listen: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    from ftsup.harness.cluster import free_port

    job = tmp_path / "job.json"
    job.write_text(json.dumps({"name": "authz", "nodes": 1, "ranks_per_node": 1, "argv": ["true"]}))
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ftsup.supervisor", "--listen", f"{listen}:{port}", "--data-dir", str(tmp_path / "log"),
         "--job", str(job), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    orphan_guard.watch(process)  # stopped even if pytest itself is killed
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while ctl(address, "status").returncode != 0:
        assert time.monotonic() < deadline and process.poll() is None, "supervisor did not come up"
    return process, address


def test_mutating_commands_need_the_token_when_one_is_configured(tmp_path: pathlib.Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-enough-length\n")
    token.chmod(0o600)
    wrong = tmp_path / "wrong"
    wrong.write_text("another-token-of-enough-length\n")
    # The raw agent never heartbeats: a long interval keeps it alive through four slow CLI runs.
    process, address = start_supervisor(tmp_path, "127.0.0.1", "--operator-token-file", str(token),
                                        "--heartbeat-interval-s", "60")
    try:
        agent = RawAgent(address)
        agent.send(hello=hello("guarded", 1))
        agent.next_of("welcome")
        assert ctl(address, "status").returncode == 0  # reading needs no token
        denied = ctl(address, "quarantine", "guarded", "--reason", "x")
        assert denied.returncode == 4 and "not authorized" in denied.stderr
        denied = ctl(address, "quarantine", "guarded", "--reason", "x", "--token-file", str(wrong))
        assert denied.returncode == 4
        allowed = ctl(address, "quarantine", "guarded", "--reason", "x", "--token-file", str(token))
        assert allowed.returncode == 0, allowed.stderr
        agent.close()
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_without_a_token_a_supervisor_reachable_beyond_loopback_refuses_commands(tmp_path: pathlib.Path) -> None:
    process, address = start_supervisor(tmp_path, "0.0.0.0", "--insecure")  # plaintext beyond loopback
    try:
        denied = ctl(address, "drain", "anyone", "--reason", "x")
        assert denied.returncode == 4 and "--operator-token-file" in denied.stderr
    finally:
        process.terminate()
        process.wait(timeout=20)
