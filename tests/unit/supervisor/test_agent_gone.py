"""A closed stream whose agent is known gone (its peer port refused a connect: AgentGone) is a
death at once, not after the reconnect grace; a stale or contradicted report decides nothing."""

from __future__ import annotations

import asyncio
import socket

from ftsup.harness.cluster import free_port
from ftsup.supervisor import agent_probe
from ftsup.supervisor.core.events import GenerationEnded, NodeDeclaredDead, QuarantineCause
from ftsup.supervisor.core.inputs import AgentGone, StreamClosed
from tests.support.builders import NOW, hello
from tests.unit.supervisor.test_decide import alive, running_cluster

GONE = "its agent's peer port 127.0.0.1:9000 refuses connections (the agent process is gone)"


def listening_socket() -> socket.socket:
    """A port that answers, as a live agent's peer service does."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", free_port()))
    sock.listen()
    return sock


def test_a_closed_stream_whose_agent_is_gone_is_dead_after_the_settle_not_the_grace_with_the_reason():
    from ftsup.supervisor.core.events import NodeSuspected
    from ftsup.supervisor.core.inputs import Tick
    from ftsup.supervisor.core.policies.failure import AGENT_GONE_SETTLE_S

    sim = running_cluster()
    assert sim.state.generation is not None
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 1.0)
    first = sim.events(AgentGone("n3", 1, 3, GONE), at=NOW + 1.01)  # well inside the 1 s grace
    assert [type(e) for e in first] == [NodeSuspected], "suspected at once, dead after the settle"
    events = sim.events(Tick(), at=NOW + 1.0 + AGENT_GONE_SETTLE_S + 0.001)
    dead = [e for e in events if isinstance(e, NodeDeclaredDead)]
    assert [d.node_id for d in dead] == ["n3"]
    assert dead[0].cause is QuarantineCause.DEAD_STREAM_LOSS and GONE in dead[0].reason
    assert dead[0].reason.startswith("stream closed and not reopened")  # the codec's cause prefix
    assert any(isinstance(e, GenerationEnded) for e in events)


def test_two_nodes_whose_agents_are_gone_a_moment_apart_end_in_one_restart():
    """A node and its buddy killed back to back: the second's stream closes inside the first's
    settle, so it is suspected when the first dies and no generation is planned until its verdict."""
    from ftsup.supervisor.core.events import GenerationStarted
    from ftsup.supervisor.core.inputs import Tick
    from ftsup.supervisor.core.policies.failure import AGENT_GONE_SETTLE_S

    sim = running_cluster(spares=2)
    generation = sim.state.generation
    assert generation is not None
    base = NOW + 4.0  # past the spares' grace after start (3 s)
    alive(sim, base)
    started: list[GenerationStarted] = []
    sim.events(StreamClosed("n2", 1, 2), at=base)
    sim.events(AgentGone("n2", 1, 2, GONE), at=base + 0.005)
    sim.events(StreamClosed("n3", 1, 3), at=base + 0.05)
    sim.events(AgentGone("n3", 1, 3, GONE), at=base + 0.055)
    for after in (0.001 + AGENT_GONE_SETTLE_S, 0.051 + AGENT_GONE_SETTLE_S):
        alive(sim, base + after, silent=("n2", "n3"))
        started += [e for e in sim.events(Tick(), at=base + after) if isinstance(e, GenerationStarted)]
    assert len(started) == 1, started
    members = {m.node_id for m in started[0].members}
    assert "n2" not in members and "n3" not in members


def test_a_report_for_another_stream_or_incarnation_or_an_open_stream_decides_nothing():
    sim = running_cluster()
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 1.0)

    def deaths(at: float, report: AgentGone) -> list[str]:
        return [e.node_id for e in sim.events(report, at=at) if isinstance(e, NodeDeclaredDead)]

    assert deaths(NOW + 1.01, AgentGone("n3", 1, 99, GONE)) == [], "not the stream that closed"
    assert deaths(NOW + 1.02, AgentGone("n3", 2, 3, GONE)) == [], "another incarnation's"
    sim.events(hello("n3", stream_id=33), at=NOW + 1.1)  # it reconnected: the probe raced that
    assert deaths(NOW + 1.2, AgentGone("n3", 1, 3, GONE)) == []
    assert sim.soft.nodes["n3"].agent_gone == ""
    assert deaths(NOW + 1.3, AgentGone("n2", 1, 2, GONE)) == [], "n2's stream never closed"


def test_with_the_probe_off_a_report_of_a_gone_agent_waits_out_the_grace():
    """--no-agent-probe: the grace alone decides, whatever AgentGone says (a heartbeat-only
    baseline must not be ended by it)."""
    import dataclasses

    from ftsup.supervisor.core.inputs import Tick
    from tests.support.builders import Sim, config

    cfg = config()
    cfg = dataclasses.replace(cfg, detector=dataclasses.replace(cfg.detector, agent_probe=False))
    sim = Sim(cfg)
    for i in (1, 2, 3):
        sim.events(hello(f"n{i}", stream_id=i))
    sim.events(hello("s1", spare=True, stream_id=10))
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 1.0)
    sim.events(AgentGone("n3", 1, 3, GONE), at=NOW + 1.01)
    assert not [e for e in sim.events(Tick(), at=NOW + 1.3) if isinstance(e, NodeDeclaredDead)]
    grace_end = NOW + 1.0 + cfg.detector.reconnect_grace_s + 0.01
    assert [e.node_id for e in sim.events(Tick(), at=grace_end) if isinstance(e, NodeDeclaredDead)] == ["n3"]


async def test_with_the_probe_off_the_runtime_connects_to_no_node():
    import dataclasses

    from ftsup.supervisor.eventlog.memory import MemoryLog
    from ftsup.supervisor.outbox import StreamOutbox
    from ftsup.supervisor.runtime import Runtime
    from tests.support.builders import config

    cfg = config(nodes=1, ranks_per_node=1)
    cfg = dataclasses.replace(cfg, detector=dataclasses.replace(cfg.detector, agent_probe=False))
    port = listening_socket()
    runtime = Runtime(cfg, MemoryLog(), tick_s=3600)
    loop = asyncio.create_task(runtime.run())
    try:
        stream_id = runtime.open_stream(StreamOutbox())
        assert (await runtime.submit(hello("n1", stream_id=stream_id, port=port.getsockname()[1]))).refusal is None
        runtime.probes.calibrate(runtime._peer_address_while_open)  # what the ticks do
        assert not runtime.probes.in_flight() and not runtime.probes.is_calibrated("n1")
        port.close()
        runtime.close_stream(stream_id, "n1", 1)
        assert not runtime.probes.in_flight()
    finally:
        loop.cancel()
        port.close()


async def test_the_probe_tells_refused_from_listening():
    listening = listening_socket()
    try:
        assert await agent_probe.refused("127.0.0.1", listening.getsockname()[1], 5.0) == ""
        # A reserved port nobody listens on: the kernel refuses connects, as a dead agent's port.
        assert "refuses connections" in await agent_probe.refused("127.0.0.1", free_port(), 5.0)
    finally:
        listening.close()


async def test_a_probe_that_fails_otherwise_says_nothing_within_its_deadline():
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await agent_probe.refused("no-such-host.invalid", 9, 2.0) == ""  # does not resolve (RFC 6761)
    assert loop.time() - started < 10


async def test_the_runtime_declares_a_gone_agents_node_dead_before_the_grace_once_its_port_was_seen_open():
    """With a 30 s grace and the periodic tick an hour away, only the probe can end a node promptly.
    n1's agent still listens after its close: the grace decides. n2's listened at calibration and
    is gone at the close: dead at once. n3's port refused the supervisor from the start (a
    firewall's REJECT answers like a dead agent): never trusted, the grace decides."""
    import dataclasses

    from ftsup.supervisor.eventlog.memory import MemoryLog
    from ftsup.supervisor.outbox import StreamOutbox
    from ftsup.supervisor.runtime import Runtime
    from tests.support.builders import config

    cfg = config(nodes=3, ranks_per_node=1)
    cfg = dataclasses.replace(cfg, detector=dataclasses.replace(cfg.detector, reconnect_grace_s=30.0))
    alive, dying = listening_socket(), listening_socket()
    log = MemoryLog()
    runtime = Runtime(cfg, log, tick_s=3600)
    loop = asyncio.create_task(runtime.run())
    try:
        ports = {"n1": alive.getsockname()[1], "n2": dying.getsockname()[1], "n3": free_port()}
        streams = {node: runtime.open_stream(StreamOutbox()) for node in ports}
        for node, stream_id in streams.items():
            assert (await runtime.submit(hello(node, stream_id=stream_id, port=ports[node]))).refusal is None
        runtime.probes.calibrate(runtime._peer_address_while_open)  # what the ticks do

        async def settled() -> None:
            while runtime.probes.in_flight():
                await asyncio.sleep(0.01)

        await asyncio.wait_for(settled(), timeout=20)
        assert [n for n in ports if runtime.probes.is_calibrated(n)] == ["n1", "n2"]
        dying.close()  # the node dies: its agent's port with it
        for node, stream_id in streams.items():
            runtime.close_stream(stream_id, node, 1)

        async def dead() -> list[NodeDeclaredDead]:
            while True:
                found = [r.event for r in log.read(1) if isinstance(r.event, NodeDeclaredDead)]
                if found and not runtime.probes.in_flight():
                    return found
                await asyncio.sleep(0.01)

        found = await asyncio.wait_for(dead(), timeout=20)
        assert [d.node_id for d in found] == ["n2"] and "refuses connections" in found[0].reason
    finally:
        loop.cancel()
        alive.close()
        dying.close()


async def test_a_port_that_still_accepts_just_after_the_close_is_tried_again_within_the_window():
    """A SIGKILLed agent's stream can be seen closed a moment before the kernel closes its
    listener; the probe tries again and finds it gone. A live agent's port is never called gone."""
    loop = asyncio.get_running_loop()
    dying, alive = listening_socket(), listening_socket()
    loop.call_later(0.12, dying.close)
    found: list[str] = []
    try:
        await agent_probe.AgentProbes._verdict("n2", "127.0.0.1", dying.getsockname()[1], 0.4, found.append)
        assert len(found) == 1 and "refuses connections" in found[0]
        await agent_probe.AgentProbes._verdict("n1", "127.0.0.1", alive.getsockname()[1], 0.4, found.append)
        assert len(found) == 1, "a port that keeps accepting is no verdict"
    finally:
        dying.close()
        alive.close()


async def test_a_node_is_calibrated_even_when_a_tick_comes_while_its_hello_is_being_appended():
    """The ticks run beside the loop: one that calibrated while a Hello's append was awaited found
    no record of the node and dropped it for good (its losses then waited out the grace)."""
    from ftsup.supervisor.eventlog.memory import MemoryLog
    from ftsup.supervisor.outbox import StreamOutbox
    from ftsup.supervisor.runtime import Runtime
    from tests.support.builders import config

    class GatedLog(MemoryLog):
        def __init__(self) -> None:
            super().__init__()
            self.entered, self.gate = asyncio.Event(), asyncio.Event()

        async def append(self, events, **kwargs):  # type: ignore[no-untyped-def,override]
            self.entered.set()
            await self.gate.wait()
            return await super().append(events, **kwargs)

    log = GatedLog()
    runtime = Runtime(config(nodes=2, ranks_per_node=1), log, tick_s=3600)
    loop = asyncio.create_task(runtime.run())
    alive = listening_socket()
    try:
        submitted = asyncio.ensure_future(
            runtime.submit(hello("n1", stream_id=runtime.open_stream(StreamOutbox()), port=alive.getsockname()[1])))
        await asyncio.wait_for(log.entered.wait(), timeout=20)
        runtime.probes.calibrate(runtime._peer_address_while_open)  # a tick during the append
        log.gate.set()
        assert (await asyncio.wait_for(submitted, timeout=20)).refusal is None
        runtime.probes.calibrate(runtime._peer_address_while_open)  # the next tick

        async def settled() -> None:
            while runtime.probes.in_flight():
                await asyncio.sleep(0.01)

        await asyncio.wait_for(settled(), timeout=20)
        assert runtime.probes.is_calibrated("n1")
    finally:
        loop.cancel()
        alive.close()
