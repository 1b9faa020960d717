"""An agent leaves a supervisor that stops answering without closing anything (a stopped process, a
host gone without a reset) for its next replica, naming the silent one in its Hello so that the
next one holds the node: by HTTP/2 pings on a working stream, by a handshake limit on a new one.

The silence is real: a TCP proxy that stops forwarding in both directions and leaves every socket
open (harness/chaos/proxy.py). The supervisors are real gRPC servers with the supervisor's server
options; the handshake case runs under mTLS, where a silent replica holds a new connection in its
TLS handshake for gRPC's whole connect timeout (20 s) unless the agent gives up sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import random
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
import structlog

from ftsup.agent import link as link_module
from ftsup.agent.config import AgentConfig
from ftsup.agent.link import Reports, SupervisorLink
from ftsup.common import tls
from ftsup.common.shard_map import ranked
from ftsup.harness.certs import main as certs_main
from ftsup.harness.chaos.proxy import PartitionProxy
from ftsup.supervisor.server.server_limits import server_options
from ftsup.v1 import agent_pb2, agent_pb2_grpc
from tests.support.async_wait import eventually

INTERVAL_S = 1.0  # the agent's heartbeat and ping interval (1 s is the shortest ping interval)


class _Replica(agent_pb2_grpc.SupervisorServicer):
    """Welcomes every Hello at once and keeps the stream; remembers the Hellos."""

    def __init__(self) -> None:
        self.hellos: list[agent_pb2.Hello] = []

    async def Connect(self, request_iterator, context):
        first = await anext(aiter(request_iterator))
        self.hellos.append(first.hello)
        yield agent_pb2.SupervisorMessage(welcome=agent_pb2.Welcome(node_id=first.hello.node_id,
                                                                    heartbeat_interval_s=INTERVAL_S))
        async for _ in request_iterator:
            pass


async def _serve(replica: _Replica, files: tls.TlsFiles | None = None) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(options=server_options())
    agent_pb2_grpc.add_SupervisorServicer_to_server(replica, server)
    port = (server.add_secure_port("127.0.0.1:0", tls.server_credentials(files)) if files is not None
            else server.add_insecure_port("127.0.0.1:0"))
    await server.start()
    return server, f"127.0.0.1:{port}"


def _node_first_at(first: str, other: str) -> str:
    """A node id whose rendezvous order dials `first` before `other`."""
    return next(f"n{i}" for i in range(1000) if ranked(f"n{i}", [first, other])[0] == first)


def _link(node_id: str, addresses: tuple[str, ...], workdir: pathlib.Path, files: tls.TlsFiles | None = None,
          resync: Callable[[], list[agent_pb2.AgentMessage]] = list) -> SupervisorLink:
    config = AgentConfig(node_id=node_id, supervisors=addresses, role="active", host="127.0.0.1",
                         peer_port=9000, workdir=workdir, heartbeat_interval_s=INTERVAL_S, gpus=8,
                         log_json=None, log_level="warning", tls_files=files)
    return SupervisorLink(config, incarnation=1, peer_port=9000, reports=Reports(), on_directive=lambda d: None,
                          running_generation=lambda: 1, log=structlog.get_logger(), rng=random.Random(0),
                          resync=resync)


@dataclasses.dataclass
class _Setup:
    a: _Replica  # the node's own replica, behind `proxy`
    b: _Replica  # its next one
    proxy: PartitionProxy
    # The agent's sessions that got their Welcome. A Hello at a replica is not yet a working
    # session: until the agent has read the Welcome, a connection lost is one that never answered
    # (its replica is named unreachable and the next one dialled), so a test that breaks a working
    # session waits for this, not for the Hello (a cut between the two, seen under load, moved the node).
    sessions: int = 0

    def resync(self) -> list[agent_pb2.AgentMessage]:
        """The link's resync hook: a session calls it once, after its Welcome (test_link_resync.py)."""
        self.sessions += 1
        return []


@contextlib.asynccontextmanager
async def _linked(workdir: pathlib.Path, *, partitioned: bool = False, server_files: tuple[tls.TlsFiles, tls.TlsFiles]
                  | None = None, agent_files: tls.TlsFiles | None = None) -> AsyncIterator[_Setup]:
    """Two replicas (the first behind a partition proxy, partitioned from the start if asked) and
    an agent's link for a node whose own replica is the first; everything stopped on exit."""
    a, b = _Replica(), _Replica()
    server_a, address_a = await _serve(a, server_files[0] if server_files else None)
    server_b, address_b = await _serve(b, server_files[1] if server_files else None)
    proxy = PartitionProxy(address_a)
    if partitioned:
        proxy.partition()
    node_id = _node_first_at(proxy.address, address_b)
    setup = _Setup(a, b, proxy)
    task = asyncio.create_task(_link(node_id, (proxy.address, address_b), workdir, agent_files, setup.resync).run())
    try:
        yield setup
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        proxy.close()
        await server_a.stop(0)
        await server_b.stop(0)


@pytest.mark.parametrize("worded", [True, False], ids=["ping-timeout", "otherwise-worded"])
async def test_a_supervisor_gone_silent_mid_stream_is_left_for_the_next_replica(tmp_path: pathlib.Path,
                                                                                  monkeypatch, worded: bool):
    if not worded:  # a grpcio that words its ping timeout otherwise: the redial's short limit saves it
        monkeypatch.setattr(link_module, "_is_silent_loss", lambda exc: False)
    async with _linked(tmp_path) as t:
        loop = asyncio.get_running_loop()
        await eventually(lambda: len(t.a.hellos) == 1 and t.sessions == 1, timeout_s=10,
                         what="the node's session at its own replica")
        t.proxy.partition()
        silent_at = loop.time()
        await eventually(lambda: len(t.b.hellos) == 1, timeout_s=10, what="the node's Hello at the next replica")
        moved_after_s = loop.time() - silent_at
        # Pings every interval, one unanswered for an interval: gone within about two (and a
        # backoff step; one more interval when the loss is not recognised as silence); gRPC's own
        # connect timeout (20 s) or TCP's retransmissions (minutes) are far. The bound tells the
        # two apart with room for a loaded machine (4 intervals failed at 4.1 s under two busy loops).
        assert moved_after_s < 10 * INTERVAL_S, f"left the silent replica after {moved_after_s:.1f}s"
        assert list(t.b.hellos[0].unreachable_replicas) == [t.proxy.address], "the Hello names the silent one"
        if not worded:
            return
        # The next replica keeps the stream: a ping every interval is no abuse to its server.
        await asyncio.sleep(3 * INTERVAL_S)  # the behaviour under test is what does not happen meanwhile
        assert len(t.b.hellos) == 1, "the stream at the next replica was ended and dialled again"
        assert len(t.a.hellos) == 1


async def test_a_replica_that_takes_the_connection_but_never_answers_is_given_up(tmp_path: pathlib.Path,
                                                                                   monkeypatch):
    monkeypatch.setattr(link_module, "CONNECT_LIMIT_S", 0.5)
    pki = tmp_path / "pki"
    assert certs_main(["--out", str(pki), "--nodes", "n", "--supervisors", "s1,s2"]) == 0

    def files(stem: str) -> tls.TlsFiles:
        return tls.TlsFiles(pki / f"{stem}.pem", pki / f"{stem}.key", pki / "ca.pem")

    # The proxy's connections wait in its accept backlog: TCP connects, the TLS handshake hangs.
    async with _linked(tmp_path, partitioned=True, server_files=(files("supervisor-s1"), files("supervisor-s2")),
                       agent_files=files("node-n")) as t:
        await eventually(lambda: len(t.b.hellos) == 1, timeout_s=10, what="the node's Hello at the next replica")
        assert list(t.b.hellos[0].unreachable_replicas) == [t.proxy.address]
        assert t.a.hellos == []


async def test_a_reset_session_dials_its_own_replica_again(tmp_path: pathlib.Path):
    """A network blip (both ends see the connection closed) is no silence: the node goes back to
    its own replica, it does not move (a rack's blip would otherwise shift its nodes' shards)."""
    async with _linked(tmp_path) as t:
        await eventually(lambda: len(t.a.hellos) == 1 and t.sessions == 1, timeout_s=10,
                         what="the node's session at its own replica")
        t.proxy.cut()
        await eventually(lambda: len(t.a.hellos) == 2, timeout_s=10, what="the node's second Hello at its own replica")
        assert t.b.hellos == [] and list(t.a.hellos[1].unreachable_replicas) == []
