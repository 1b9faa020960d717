"""The runtime shell around the core: it decides only what it could log, and snapshots as told."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ftsup.supervisor.core.events import Event, Record
from ftsup.supervisor.core.inputs import Tick
from ftsup.supervisor.eventlog.api import LogUnavailable
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime
from tests.support.builders import config, hello


class FlakyLog(MemoryLog):
    """A memory log that fails appends while `is_full` is set, like a full disk."""

    def __init__(self) -> None:
        super().__init__()
        self.is_full = False

    async def append(self, events: Sequence[Event], **kwargs: object) -> list[Record]:
        if self.is_full:
            raise LogUnavailable("No space left on device")
        return await super().append(events, **kwargs)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def handle(runtime: Runtime, inp: object) -> str | None:
    return (await runtime._handle(inp)).refusal  # the loop's one step, without the ticker task


async def test_with_an_unwritable_log_nothing_is_decided_and_it_resumes_when_writable():
    log = FlakyLog()
    clock = Clock()
    runtime = Runtime(config(nodes=1, ranks_per_node=1), log, clock=clock, wall_clock=lambda: 0.0)
    log.is_full = True
    await handle(runtime, hello("n1", stream_id=runtime.open_stream(StreamOutbox())))
    assert runtime.state.applied_seq == 0 and not runtime.state.nodes
    assert "No space left on device" in runtime.degraded_reason
    log.is_full = False
    await handle(runtime, hello("n1", stream_id=runtime.open_stream(StreamOutbox())))
    assert runtime.degraded_reason == ""
    assert "n1" in runtime.state.nodes and runtime.state.applied_seq == log.head_seq >= 1


async def test_a_restarted_runtime_replays_from_its_snapshot_to_the_same_state():
    log = MemoryLog()
    clock = Clock()
    runtime = Runtime(config(nodes=2, ranks_per_node=1), log, clock=clock, wall_clock=lambda: 0.0,
                      snapshot_every=2)
    for node in ("n1", "n2"):
        await handle(runtime, hello(node, stream_id=runtime.open_stream(StreamOutbox())))
    await handle(runtime, Tick())
    assert runtime.state.generation is not None
    assert log.load_snapshot() is not None, "a snapshot is due every 2 events"
    again = Runtime(config(nodes=2, ranks_per_node=1), log, clock=clock, wall_clock=lambda: 0.0)
    assert again.state == runtime.state


async def test_a_new_leaders_first_record_is_leader_elected_even_when_the_log_refused_it_at_first():
    from ftsup.supervisor.core.events import LeaderElected, NodeRegistered

    log = FlakyLog()
    runtime = Runtime(config(nodes=1, ranks_per_node=1), log, clock=Clock(), wall_clock=lambda: 0.0, tick_s=3600)
    runtime.become_follower()
    loop = asyncio.create_task(runtime.run())
    try:
        log.is_full = True
        runtime.become_leader(term=3, address="10.0.0.7:7000")
        refused = await runtime.submit(hello("n1", stream_id=runtime.open_stream(StreamOutbox())))
        assert refused.refusal and log.head_seq == 0, "nothing may be decided while the log refuses"
        log.is_full = False
        accepted = await runtime.submit(hello("n1", stream_id=runtime.open_stream(StreamOutbox())))
        assert accepted.refusal is None
        records = list(log.read(1))
        assert records[0].event == LeaderElected(term=3, address="10.0.0.7:7000", caught_up_seq=0)
        assert records[0].term == 3 and isinstance(records[1].event, NodeRegistered)
        assert [r.event for r in records].count(records[0].event) == 1, "announced once"
    finally:
        loop.cancel()


async def test_a_closed_streams_node_is_declared_dead_when_its_grace_ends_not_at_the_next_periodic_tick():
    """Every node-loss recovery waited for the periodic tick after the grace (up to --tick-s);
    the runtime schedules a Tick for the grace's end instead. With the periodic tick an hour
    away, only that Tick can end it."""
    import dataclasses
    import socket
    import time

    from ftsup.harness.cluster import free_port
    from ftsup.supervisor.core.events import NodeDeclaredDead

    cfg = config(nodes=2, ranks_per_node=1)
    cfg = dataclasses.replace(cfg, detector=dataclasses.replace(cfg.detector, reconnect_grace_s=0.2))
    log = MemoryLog()
    runtime = Runtime(cfg, log, tick_s=3600)
    loop = asyncio.create_task(runtime.run())
    listening = socket.socket()  # the agents' peer port still answers: only the grace ends them
    listening.bind(("127.0.0.1", free_port()))
    listening.listen()
    try:
        streams = {node: runtime.open_stream(StreamOutbox()) for node in ("n1", "n2")}
        for node, stream_id in streams.items():
            hello_ = hello(node, stream_id=stream_id, port=listening.getsockname()[1])
            assert (await runtime.submit(hello_)).refusal is None
        closed_at = time.monotonic()
        runtime.close_stream(streams["n2"], "n2", 1)
        runtime.close_stream(streams["n1"], "n1", 1)  # the same bucket: one Tick for both
        assert len(runtime._grace_wakes) == 1

        async def dead() -> set[str]:
            while True:
                found = {r.event.node_id for r in log.read(1) if isinstance(r.event, NodeDeclaredDead)}
                if found == {"n1", "n2"}:
                    return found
                await asyncio.sleep(0.01)

        await asyncio.wait_for(dead(), timeout=30)
        assert time.monotonic() - closed_at >= 0.2, "not before the grace"
        assert not runtime._grace_wakes
    finally:
        loop.cancel()
        listening.close()
