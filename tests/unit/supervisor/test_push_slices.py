"""A push past a slice of nodes goes out a slice per turn of the leader's loop, inputs between."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ftsup.supervisor.core.inputs import Tick
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.push_slices import OwedPushes
from ftsup.supervisor.runtime import Runtime
from tests.support.async_wait import eventually
from tests.support.builders import config, hello


class _Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def test_owed_nodes_go_in_order_a_slice_at_a_time_and_one_pushed_meanwhile_is_owed_no_more() -> None:
    lines, now = _Lines(), [10.0]
    owed = OwedPushes(2, lines, clock=lambda: now[0])
    assert owed.split(["a", "b"], generation=1) == ["a", "b"] and not owed, "a slice or less: all now"
    assert owed.split(["a", "b", "c", "d", "e"], generation=1) == ["a", "b"]
    assert len(owed) == 3 and lines.lines == [("directives pushed over several turns",
                                                {"nodes": 5, "per_turn": 2, "generation": 1})]
    assert owed.split(["d"], generation=1) == ["d"], "a later push of d replaces the owed one"
    now[0] = 10.25
    assert owed.take(generation=1) == ["c", "e"]
    assert not owed and lines.lines[-1] == ("directive push done", {"nodes": 5, "seconds": 0.25, "generation": 1})
    assert owed.split(["x", "y", "z"], generation=2) == ["x", "y"]
    owed.clear()
    assert not owed and owed.take(generation=2) == []
    owed.note_busy(0.5)
    owed.note_busy(0.25)
    assert owed.take_busy_s() == 0.75 and owed.take_busy_s() == 0.0
    with pytest.raises(ValueError, match="push slice"):
        OwedPushes(0, lines)


async def test_the_ticker_forgives_every_node_the_time_a_sliced_push_kept_the_loop() -> None:
    """Slices keep the ticker on time, but no agent stream is read during one: their time is a
    stall to forgive, as the one long turn's lateness was (part 1 measured more false deaths
    from slices without it)."""
    runtime = Runtime(config(nodes=1, ranks_per_node=1), MemoryLog(), tick_s=0.01)
    posted: list[Any] = []
    runtime.post = posted.append  # type: ignore[method-assign]
    runtime._owed.note_busy(3.0)
    ticker = asyncio.create_task(runtime._tick_forever())
    try:
        await eventually(lambda: len(posted) >= 2, 10.0, "two ticks")
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
    assert isinstance(posted[0], Tick) and posted[0].stalled_s >= 3.0
    assert posted[1].stalled_s < 3.0, "forgiven once"


async def test_a_followers_ticker_counts_its_loops_lateness_and_warns_of_a_stall_posting_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A follower's loop is its link shard's: a stall there is seen (a warning, the metric), not
    forgiven (the leader forgives its own stalls only)."""
    import ftsup.supervisor.runtime as runtime_module
    from ftsup.supervisor.metrics import SupervisorMetrics

    lines = _Lines()  # (the module's logger itself: an earlier test may have set structlog's level to error)
    monkeypatch.setattr(runtime_module, "log", lines)

    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # (each reading 1 s on: every tick wakes ~1 s late)
        return now[0]

    runtime = Runtime(config(nodes=1, ranks_per_node=1), MemoryLog(), tick_s=0.01, clock=clock)
    runtime.become_follower("elsewhere:1")
    runtime.metrics = SupervisorMetrics()
    posted: list[Any] = []
    runtime.post = posted.append  # type: ignore[method-assign]
    ticker = asyncio.create_task(runtime._tick_forever())
    try:
        await eventually(lambda: _ticks_observed(runtime) >= 2, 10.0, "two ticks observed")
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
    assert posted == [], "a follower posts no Tick"
    stalls = [fields for event, fields in lines.lines if event.startswith("follower stalled")]
    assert stalls and stalls[0]["stalled_s"] == pytest.approx(0.99), lines.lines


def _ticks_observed(runtime: Runtime) -> float:
    assert runtime.metrics is not None
    return next(sample.value for sample in runtime.metrics.loop_late_seconds.collect()[0].samples
                if sample.name.endswith("_count"))


async def test_a_generation_start_directs_every_node_over_several_turns_with_an_input_handled_between() -> None:
    runtime = Runtime(config(nodes=5, ranks_per_node=1), MemoryLog(), tick_s=3600, push_slice=1)
    trace: list[str] = []
    push, handle = runtime._push_directives, runtime._handle_guarded

    def traced_push(node_ids: Any = None, **kwargs: Any) -> None:
        trace.append("push")
        push(node_ids, **kwargs)

    async def traced_handle(inp: Any, at_s: float | None) -> Any:
        trace.append(type(inp).__name__)
        return await handle(inp, at_s)

    runtime._push_directives = traced_push  # type: ignore[method-assign]
    runtime._handle_guarded = traced_handle  # type: ignore[method-assign]
    outboxes = {f"n{i}": StreamOutbox() for i in range(5)}
    loop = asyncio.create_task(runtime.run())
    try:
        replies = [runtime.submit(hello(node, stream_id=runtime.open_stream(box))) for node, box in outboxes.items()]
        assert all(reply.refusal is None for reply in await asyncio.gather(*replies))
        assert runtime.state.generation is not None, "the five Hellos started the generation"
        assert (await runtime.submit(Tick())).refusal is None
        await eventually(lambda: not runtime._owed, 10.0, "every node directed")
        directed = {node for node, box in outboxes.items()
                    if any(m.WhichOneof("kind") == "directive" for m in box._items)}
        assert directed == set(outboxes)
        assert trace.index("Tick") < len(trace) - 1 - trace[::-1].index("push"), f"the Tick waited: {trace}"
        assert trace.count("push") == 5, "the start's push (one node), then one owed node a turn"
        assert runtime._owed.take_busy_s() > 0, "the slices' time is kept for the ticker"
        runtime._push_directives(list(outboxes))
        runtime._owed.split(list(outboxes), runtime.generation_in_force)
        assert runtime.directives_owed == 4, "the gauge ftsup_directives_owed reads"
        runtime.become_follower("elsewhere:1")
        assert not runtime._owed and runtime.directives_owed == 0, "a follower owes no directive"
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
