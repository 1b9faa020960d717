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
