"""Real agent processes against a fake Supervisor servicer on loopback.

Covers the agent's contract end to end: Hello and heartbeats, a RUN directive launching ranks
with the right env, relayed StepReport / RankFinished / TrainerExit, buddy replication with a
SnapshotReports from both holders, FetchSnapshot from the buddy, a peer restore through GetRestore, a
clear FAILED_PRECONDITION when a restore cannot be had, exit code 3 on a permanently refused Hello,
retries (trainers running) on a retryable one, and under mTLS an agent that refuses a server
presenting a node's certificate instead of a supervisor's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2, peer_pb2, peer_pb2_grpc

pytestmark = pytest.mark.integration

TRAINER = r'''
import hashlib, json, os, sys
import grpc
from ftsup.v1 import agent_pb2, peer_pb2, peer_pb2_grpc
env = os.environ
rank, gen = int(env["RANK"]), int(env["FTSUP_GENERATION"])
stub = peer_pb2_grpc.TrainerLinkStub(grpc.insecure_channel(env["FTSUP_AGENT_ADDRESS"]))
info = {k: env.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "FTSUP_AGENT_ADDRESS", "FTSUP_GENERATION", "FTSUP_NODE_ID", "FTSUP_RESTORE_STEP",
        "PYTHONUNBUFFERED", "EXTRA")}
out = os.path.join(env["TEST_OUT"], f"rank{rank}.gen{gen}.json")
try:  # a chunk stream; no chunk at all: start fresh
    restore = list(stub.GetRestore(peer_pb2.GetRestoreRequest(rank=rank, generation=gen), timeout=20))
except grpc.RpcError as e:
    info["restore_error"] = [e.code().name, e.details()]
    json.dump(info, open(out, "w"))
    sys.exit(3)
info["restored"] = b"".join(c.data for c in restore).decode() if restore else None
step = restore[0].header.step + 1 if restore else 1
digest = f"{rank}/{env['WORLD_SIZE']}/{env['LOCAL_RANK']}"
stub.ReportStep(agent_pb2.StepReport(generation=gen, rank=rank, step=step, step_time_s=0.1,
                                     compute_time_s=0.05, loss=0.5, param_digest=digest))
payload = f"state-of-rank-{rank}-step-{step}".encode()
def chunks(payload, sha256):  # two chunks: the header with the first, the sha256 with the last
    header = peer_pb2.SnapshotHeader(generation=gen, rank=rank, step=step, owner_node_id=env["FTSUP_NODE_ID"],
                                     size_bytes=len(payload))
    yield peer_pb2.SnapshotChunk(header=header, data=payload[:5])
    yield peer_pb2.SnapshotChunk(data=payload[5:], sha256=sha256)
stub.PutSnapshot(chunks(payload, hashlib.sha256(payload).hexdigest()))
for name, call in (
    ("bad_rank", lambda: stub.ReportStep(agent_pb2.StepReport(generation=gen, rank=999, step=1))),
    ("bad_sha", lambda: stub.PutSnapshot(chunks(b"xxxxxxxx", "0" * 64))),
):
    try:
        call()
        info[name] = "accepted"
    except grpc.RpcError as e:
        info[name] = e.code().name
stub.ReportFinished(agent_pb2.RankFinished(generation=gen, rank=rank, step=step, param_digest=digest))
json.dump(info, open(out, "w"))
'''


STEPPER = r'''
import os, signal, time
import grpc
from ftsup.v1 import agent_pb2, peer_pb2_grpc
env = os.environ
if env.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank, gen = int(env["RANK"]), int(env["FTSUP_GENERATION"])
open(os.path.join(env["TEST_OUT"], f"pid{rank}"), "w").write(str(os.getpid()))
stub = peer_pb2_grpc.TrainerLinkStub(grpc.insecure_channel(env["FTSUP_AGENT_ADDRESS"]))
step = 0
while True:
    step += 1
    stub.ReportStep(agent_pb2.StepReport(generation=gen, rank=rank, step=step, step_time_s=0.05))
    time.sleep(0.05)  # the fake trainer's own 50 ms step (its workload), not a wait in the test
'''


class FakeSupervisor(agent_pb2_grpc.SupervisorServicer):
    """Records every AgentMessage per node; sends what the test queues; refuses listed node ids."""

    def __init__(self) -> None:
        self.received: dict[str, list[agent_pb2.AgentMessage]] = defaultdict(list)
        self.outgoing: dict[str, asyncio.Queue[agent_pb2.SupervisorMessage]] = defaultdict(asyncio.Queue)
        self.refuse: dict[str, str] = {}  # node -> reason of a PERMANENT Hello refusal
        self.defer: dict[str, str] = {}  # node -> reason of a RETRYABLE one, while listed
        self.redirect_to: str | None = None  # answer every Hello with NotLeader(this)

    def of(self, node: str, kind: str) -> list:
        return [getattr(m, kind) for m in self.received[node] if m.WhichOneof("kind") == kind]

    def send(self, node: str, directive: agent_pb2.Directive) -> None:
        self.outgoing[node].put_nowait(agent_pb2.SupervisorMessage(directive=directive))

    async def Connect(self, request_iterator, context):
        first = await context.read()
        node = first.hello.node_id
        self.received[node].append(first)
        if self.redirect_to is not None:
            await context.write(agent_pb2.SupervisorMessage(
                not_leader=agent_pb2.NotLeader(leader_address=self.redirect_to)))
            return
        for table, kind in ((self.refuse, agent_pb2.REFUSAL_KIND_PERMANENT),
                            (self.defer, agent_pb2.REFUSAL_KIND_RETRYABLE)):
            if node in table:
                await context.write(agent_pb2.SupervisorMessage(refusal=agent_pb2.Refusal(
                    reason=table[node], refused="hello", kind=kind, ends_stream=True)))
                return
        await context.write(agent_pb2.SupervisorMessage(welcome=agent_pb2.Welcome(
            node_id=node, incarnation=first.hello.incarnation, heartbeat_interval_s=0.2, term=1)))

        async def read() -> None:
            while (message := await context.read()) is not grpc.aio.EOF:
                self.received[node].append(message)

        reader = asyncio.create_task(read())
        try:
            while not reader.done():
                getter = asyncio.create_task(self.outgoing[node].get())
                done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    if getter.result() is None:  # the test ends this stream
                        return
                    await context.write(getter.result())
                else:
                    getter.cancel()
        finally:
            reader.cancel()


async def until(predicate: Callable[[], object], timeout_s: float = 15.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def supervisor():
    fake = FakeSupervisor()
    server = grpc.aio.server()
    agent_pb2_grpc.add_SupervisorServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield fake, f"127.0.0.1:{port}"
    await server.stop(0)


class Agents:
    def __init__(self, tmp_path: Path, address: str) -> None:
        self.tmp_path = tmp_path
        self.address = address
        self.procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(self, node: str, *extra: str) -> asyncio.subprocess.Process:
        workdir = self.tmp_path / node
        workdir.mkdir()
        stderr = open(self.tmp_path / f"{node}.stderr", "wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ftsup.agent", "--node-id", node, "--supervisor", self.address,
            "--workdir", str(workdir), "--heartbeat-interval-s", "0.2", "--no-log-json", "--gpus", "0", *extra,
            stdout=asyncio.subprocess.DEVNULL, stderr=stderr, env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
        )
        stderr.close()
        self.procs[node] = proc
        return proc

    def stderr(self, node: str) -> str:
        return (self.tmp_path / f"{node}.stderr").read_text()

    async def stop_all(self) -> dict[str, int]:
        codes = {}
        for node, proc in self.procs.items():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            codes[node] = await asyncio.wait_for(proc.wait(), 10)
        return codes


@pytest.fixture
async def agents(supervisor, tmp_path):
    group = Agents(tmp_path, supervisor[1])
    yield group
    for proc in group.procs.values():
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def peer_address(fake: FakeSupervisor, node: str) -> str:
    hello = fake.of(node, "hello")[0]
    return f"{hello.host}:{hello.peer_port}"


def standby_directive(generation: int, *grants: agent_pb2.PeerGrant) -> agent_pb2.Directive:
    return agent_pb2.Directive(generation=generation, action=agent_pb2.ACTION_STANDBY, peer_grants=list(grants))


def run_directive(generation: int, ranks: list[int], out: Path, **kw) -> agent_pb2.Directive:
    return agent_pb2.Directive(
        generation=generation, action=agent_pb2.ACTION_RUN, ranks=ranks, world_size=2,
        master_addr="127.0.0.1", master_port=29500, argv=[sys.executable, "-c", TRAINER],
        env=[agent_pb2.EnvVar(name="TEST_OUT", value=str(out)), agent_pb2.EnvVar(name="EXTRA", value="x")], **kw,
    )


async def test_agents_run_ranks_replicate_snapshots_and_restore_from_a_peer(supervisor, agents, tmp_path):
    fake, _ = supervisor
    out = tmp_path / "out"
    out.mkdir()
    for node in ("a", "b", "c"):
        await agents.start(node, *(["--role", "spare"] if node == "c" else []))
    await until(lambda: all(fake.of(n, "hello") for n in "abc"), what="three Hellos")
    hello = fake.of("a", "hello")[0]
    assert hello.role == events_pb2.NODE_ROLE_ACTIVE and hello.incarnation > 0 and hello.peer_port > 0
    assert fake.of("c", "hello")[0].role == events_pb2.NODE_ROLE_SPARE
    await until(lambda: len(fake.of("a", "heartbeat")) >= 2, what="heartbeats")
    assert fake.of("a", "heartbeat")[0].running_generation == 0

    # b is a's buddy (it stores a's ranks); the test itself fetches from b as "a" (a claim: no TLS).
    fake.send("b", standby_directive(1, agent_pb2.PeerGrant(node_id="a", store_ranks=[0, 1], fetch_ranks=[0, 1])))
    fake.send("a", run_directive(1, [0, 1], out, buddy_node_id="b", buddy_address=peer_address(fake, "b")))
    await until(lambda: len(fake.of("a", "trainer_exit")) == 2, what="two TrainerExits from a")
    await until(lambda: len(fake.of("a", "snapshot_report")) == 2, what="two SnapshotReports from a")

    for rank in (0, 1):
        info = json.loads((out / f"rank{rank}.gen1.json").read_text())
        assert info == {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "FTSUP_AGENT_ADDRESS": f"unix:{tmp_path}/a/agent.sock", "FTSUP_GENERATION": "1",
            "FTSUP_NODE_ID": "a", "FTSUP_RESTORE_STEP": "", "PYTHONUNBUFFERED": "1", "EXTRA": "x",
            "restored": None, "bad_rank": "INVALID_ARGUMENT", "bad_sha": "INVALID_ARGUMENT",
        }
        assert (tmp_path / "a" / f"rank-{rank}.gen-1.log").exists()
    steps = sorted((s.rank, s.step, s.param_digest) for s in fake.of("a", "step_report"))
    assert steps == [(0, 1, "0/2/0"), (1, 1, "1/2/1")]
    assert sorted((f.rank, f.step) for f in fake.of("a", "rank_finished")) == [(0, 1), (1, 1)]
    exits = sorted((e.generation, e.rank, e.exit_code, e.finished) for e in fake.of("a", "trainer_exit"))
    assert exits == [(1, 0, 0, True), (1, 1, 0, True)]
    # Each holder reports its own copy: the owner "a" at once, the buddy "b" when it stored it.
    reports = sorted((r.rank, r.step, list(r.holder_node_ids), r.size_bytes) for r in fake.of("a", "snapshot_report"))
    assert reports == [(0, 1, ["a"], 22), (1, 1, ["a"], 22)]
    buddy_reports = sorted((r.rank, r.step, list(r.holder_node_ids)) for r in fake.of("b", "snapshot_report"))
    assert buddy_reports == [(0, 1, ["b"]), (1, 1, ["b"])]

    async with grpc.aio.insecure_channel(peer_address(fake, "b")) as channel:
        peer = peer_pb2_grpc.AgentPeerStub(channel)
        fetched = [c async for c in peer.FetchSnapshot(peer_pb2.FetchSnapshotRequest(rank=1, step=1, node_id="a"))]
        assert (fetched[0].header.rank, fetched[0].header.step, fetched[0].header.size_bytes) == (1, 1, 22)
        assert b"".join(c.data for c in fetched) == b"state-of-rank-1-step-1"
        assert fetched[-1].sha256 == hashlib.sha256(b"state-of-rank-1-step-1").hexdigest()
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            [c async for c in peer.FetchSnapshot(peer_pb2.FetchSnapshotRequest(rank=1, step=42, node_id="a"))]
        with pytest.raises(grpc.aio.AioRpcError) as stranger:  # nothing grants node "x" a fetch from b
            [c async for c in peer.FetchSnapshot(peer_pb2.FetchSnapshotRequest(rank=1, step=1, node_id="x"))]
        assert stranger.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND and "rank 1 step 42" in missing.value.details()

    # Spare c replaces a: rank 0 restores from b's copy; rank 1 names a source without it.
    peer_kind = events_pb2.RESTORE_KIND_PEER_SNAPSHOT
    fake.send("b", standby_directive(2, agent_pb2.PeerGrant(node_id="c", fetch_ranks=[0])))
    fake.send("c", run_directive(2, [0, 1], out, restore_step=1, restores=[
        agent_pb2.RestoreFrom(rank=0, kind=peer_kind, source_node_id="b", source_address=peer_address(fake, "b")),
        agent_pb2.RestoreFrom(rank=1, kind=peer_kind, source_node_id="c", source_address=peer_address(fake, "c")),
    ]))
    await until(lambda: len(fake.of("c", "trainer_exit")) == 2, what="two TrainerExits from c")
    restored = json.loads((out / "rank0.gen2.json").read_text())
    assert restored["restored"] == "state-of-rank-0-step-1" and restored["FTSUP_RESTORE_STEP"] == "1"
    failed = json.loads((out / "rank1.gen2.json").read_text())
    assert failed["restore_error"][0] == "FAILED_PRECONDITION" and "rank 1 step 1" in failed["restore_error"][1]
    exits = sorted((e.generation, e.rank, e.exit_code, e.finished) for e in fake.of("c", "trainer_exit"))
    assert exits == [(2, 0, 0, True), (2, 1, 3, False)]

    assert await agents.stop_all() == {"a": 0, "b": 0, "c": 0}


async def test_a_permanently_refused_hello_makes_the_agent_exit_3_with_the_reason(supervisor, agents):
    fake, _ = supervisor
    fake.refuse["dup"] = "node id dup is already connected"
    proc = await agents.start("dup")
    assert await asyncio.wait_for(proc.wait(), 15) == 3
    assert "node id dup is already connected" in agents.stderr("dup")


async def test_a_retryable_hello_refusal_keeps_the_trainers_and_the_agent_joins_once_decided(supervisor, agents, tmp_path):
    fake, _ = supervisor
    out = tmp_path / "out"
    out.mkdir()
    proc = await agents.start("slow")
    await until(lambda: fake.of("slow", "heartbeat"), what="the agent joined")
    fake.send("slow", stepper(1, out))
    pid_file = out / "pid0"  # written by the trainer: wait for its content, not just the file
    await until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the trainer started")
    pid = int(pid_file.read_text())
    # The supervisor restarts and cannot decide (its log is unavailable): every Hello is deferred.
    fake.defer["slow"] = "not decided: event log unavailable: No space left on device"
    hellos = len(fake.of("slow", "hello"))
    fake.outgoing["slow"].put_nowait(None)  # type: ignore[arg-type]  # ends the stream: the agent reconnects
    await until(lambda: len(fake.of("slow", "hello")) >= hellos + 3, what="three deferred Hellos")
    assert proc.returncode is None and is_alive(pid)
    del fake.defer["slow"]
    beats = len(fake.of("slow", "heartbeat"))
    await until(lambda: len(fake.of("slow", "heartbeat")) > beats, what="heartbeats after the refusals stop")
    assert is_alive(pid) and "hello_deferred" in agents.stderr("slow")
    assert await agents.stop_all() == {"slow": 0}


async def serve(fake: FakeSupervisor, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    agent_pb2_grpc.add_SupervisorServicer_to_server(fake, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


def stepper(generation: int, out: Path, *, ignore_term: bool = False) -> agent_pb2.Directive:
    env = [agent_pb2.EnvVar(name="TEST_OUT", value=str(out))]
    if ignore_term:
        env.append(agent_pb2.EnvVar(name="IGNORE_TERM", value="1"))
    return agent_pb2.Directive(
        generation=generation, action=agent_pb2.ACTION_RUN, ranks=[0], world_size=1,
        master_addr="127.0.0.1", master_port=29500, argv=[sys.executable, "-c", STEPPER], env=env,
    )


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state from /proc.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def test_not_leader_redirects_the_agent_to_the_leader(supervisor, agents):
    leader, leader_address = supervisor
    follower = FakeSupervisor()
    follower.redirect_to = leader_address
    server, port = await serve(follower)
    try:
        agents.address = f"127.0.0.1:{port}"
        await agents.start("r")
        await until(lambda: leader.of("r", "heartbeat"), what="heartbeats at the leader")
        assert follower.of("r", "hello")
    finally:
        await server.stop(0)
    assert await agents.stop_all() == {"r": 0}


async def test_trainers_survive_a_supervisor_outage_and_queued_reports_arrive_after_reconnect(agents, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    first = FakeSupervisor()
    server, port = await serve(first)
    agents.address = f"127.0.0.1:{port}"
    await agents.start("q")
    await until(lambda: first.of("q", "hello"), what="Hello")
    first.send("q", stepper(1, out))
    await until(lambda: first.of("q", "step_report"), what="a first step report")
    await server.stop(0)
    pid = int((out / "pid0").read_text())

    second = FakeSupervisor()
    # The outage lasts until the agent has noticed it; the trainer keeps stepping meanwhile.
    await until(lambda: "stream_error" in agents.stderr("q"), what="the agent noticing the outage")
    server, _ = await serve(second, port)
    try:
        await until(lambda: second.of("q", "hello"), what="Hello after reconnect")
        assert second.of("q", "hello")[0].incarnation == first.of("q", "hello")[0].incarnation
        await until(lambda: second.of("q", "heartbeat") and second.of("q", "heartbeat")[-1].running_generation == 1,
                    what="heartbeat naming generation 1")
        seen = sorted({r.step for r in first.of("q", "step_report")} | {r.step for r in second.of("q", "step_report")})
        assert seen == list(range(1, seen[-1] + 1)), "steps reported while disconnected were lost"
        assert is_alive(pid)
        codes = await agents.stop_all()
    finally:
        await server.stop(0)
    assert codes == {"q": 0}
    assert not is_alive(pid)


async def test_sigterm_stops_trainers_that_ignore_sigterm_after_the_grace(supervisor, agents, tmp_path):
    fake, _ = supervisor
    out = tmp_path / "out"
    out.mkdir()
    await agents.start("t")
    await until(lambda: fake.of("t", "hello"), what="Hello")
    fake.send("t", stepper(1, out, ignore_term=True))
    await until(lambda: fake.of("t", "step_report"), what="a step report")
    pid = int((out / "pid0").read_text())
    assert os.getpgid(pid) == os.getpgid(agents.procs["t"].pid), "trainer must stay in the agent's process group"
    assert await agents.stop_all() == {"t": 0}
    assert not is_alive(pid)


async def test_under_mtls_the_agent_refuses_a_server_presenting_a_node_certificate(tmp_path):
    from ftsup.common import tls
    from ftsup.common.shard_map import ranked
    from ftsup.harness.certs import main as certs_main

    pki = tmp_path / "pki"
    assert certs_main(["--out", str(pki), "--nodes", "node-1,node-9", "--supervisors", "sup-1"]) == 0

    def files(stem: str) -> tls.TlsFiles:
        return tls.TlsFiles(pki / f"{stem}.pem", pki / f"{stem}.key", pki / "ca.pem")

    async def serve_tls(fake: FakeSupervisor, stem: str) -> tuple[grpc.aio.Server, str]:
        server = grpc.aio.server()
        agent_pb2_grpc.add_SupervisorServicer_to_server(fake, server)
        port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(files(stem)))
        await server.start()
        return server, f"127.0.0.1:{port}"

    # Both certificates come from the same CA and are valid for 127.0.0.1: only the identity differs.
    impostor, real = FakeSupervisor(), FakeSupervisor()
    real_server, real_address = await serve_tls(real, "supervisor-sup-1")
    # An agent dials replicas in its node's rendezvous order (link shards): the impostor must come
    # first in node-1's, so it listens on ports until it does (half of them qualify).
    for _ in range(64):
        impostor_server, impostor_address = await serve_tls(impostor, "node-node-9")
        if ranked("node-1", [impostor_address, real_address])[0] == impostor_address:
            break
        await impostor_server.stop(0)
    group = Agents(tmp_path, f"{impostor_address},{real_address}")  # tried in turn, the impostor first
    try:
        f = files("node-node-1")
        await group.start("node-1", "--tls-cert", str(f.cert), "--tls-key", str(f.key), "--tls-ca", str(f.ca))
        await until(lambda: len(real.of("node-1", "heartbeat")) >= 2, what="the agent joined the real supervisor")
        await until(lambda: group.stderr("node-1").count(impostor_address) >= 2,
                    what="the agent tried the impostor twice")
        assert impostor.received == {}  # the handshake failed: no Hello, so no directive could be taken
        assert await group.stop_all() == {"node-1": 0}
    finally:
        for proc in group.procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await impostor_server.stop(0)
        await real_server.stop(0)
