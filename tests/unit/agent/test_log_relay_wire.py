"""`supervisorctl logs`' relay over real gRPC with real mTLS certificates: the supervisor's
certificate may tail a rank's output on a node, a node's may not, and an operator's cancellation
releases the relay's call and the agent's tail (its file and its stream slot)."""

from __future__ import annotations

import asyncio
import pathlib

import grpc
import pytest
import structlog

from ftsup.agent.link import Reports
from ftsup.agent.log_tail import LogTailer
from ftsup.agent.peer_auth import PeerAuthority
from ftsup.agent.peer_service import PeerService
from ftsup.agent.snapshots import SnapshotStore
from ftsup.common import tls
from ftsup.harness.certs import main as certs_main
from ftsup.supervisor.server.log_relay import LogRelay
from ftsup.v1 import operator_pb2, peer_pb2, peer_pb2_grpc
from tests.support.builders import Sim, config, hello
from tests.unit.agent.test_peer_hardening import until


def files(root: pathlib.Path, name: str) -> tls.TlsFiles:
    return tls.TlsFiles(root / f"{name}.pem", root / f"{name}.key", root / "ca.pem")


async def test_only_a_supervisor_may_tail_and_a_cancelled_follow_releases_both_ends(tmp_path: pathlib.Path) -> None:
    certs = tmp_path / "certs"
    assert certs_main(["--out", str(certs), "--nodes", "a,b", "--supervisors", "s1"]) == 0
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "rank-0.gen-1.log").write_bytes(b"".join(b"line %d\n" % i for i in range(300)))
    tailer = LogTailer("b", workdir, lambda _path: True, poll_s=0.01)
    service = PeerService("b", SnapshotStore(), Reports(), structlog.get_logger("test"), PeerAuthority("b"),
                          is_tls=True, logs=tailer)
    server = grpc.aio.server()
    peer_pb2_grpc.add_AgentPeerServicer_to_server(service, server)
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(files(certs, "node-b")))
    await server.start()
    try:
        sim = Sim(config(nodes=1, ranks_per_node=1))
        sim.events(hello("b", port=port))
        relay = LogRelay(lambda: sim.state, files(certs, "supervisor-s1"))

        backlog = [m async for m in relay.stream(operator_pb2.StreamLogsRequest(rank=0, lines=260))]
        assert [len(m.lines) for m in backlog] == [256, 4]  # bounded messages
        assert backlog[0].lines[0] == "line 40" and backlog[-1].lines[-1] == "line 299"

        as_node = grpc.aio.secure_channel(f"127.0.0.1:{port}", tls.channel_credentials(files(certs, "node-a")),
                                          options=tls.expect_node("b"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            _ = [m async for m in peer_pb2_grpc.AgentPeerStub(as_node).TailLog(peer_pb2.TailLogRequest(rank=0))]
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        await as_node.close()

        follow = relay.stream(operator_pb2.StreamLogsRequest(rank=0, lines=1, follow=True))
        assert list((await anext(follow)).lines) == ["line 299"]
        assert relay.relays == 1 and tailer.streams == 1
        waiting = asyncio.create_task(anext(follow))  # the rank prints nothing more: it waits
        await asyncio.sleep(0.05)
        waiting.cancel()  # what grpc does to the Operator handler when supervisorctl goes away
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert relay.relays == 0
        await until(lambda: tailer.streams == 0, "the agent's tail to end after the relay's cancellation")
    finally:
        await server.stop(0)
