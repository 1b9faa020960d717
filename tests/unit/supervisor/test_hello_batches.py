"""Registration in batches: a batch of Hellos decided at once is the same decision as the same
Hellos decided one by one, folding a batch copies the node map once, and the runtime appends one
record batch for Hellos queued back to back (one fsync'd append per batch, not per node)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core.decide import decide_hellos
from ftsup.supervisor.core.events import Event, GenerationStarted, NodeRegistered, Record
from ftsup.supervisor.core.evolve import evolve, evolve_all
from ftsup.supervisor.core.inputs import AgentHello, Heartbeat, OperatorRequest, Tick
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime
from tests.support.builders import NOW, Sim, config, hello
from tests.unit.supervisor.test_properties import inputs

NODES = ["n1", "n2", "n3", "s1"]


def _hello(node_id: str, incarnation: int) -> AgentHello:
    return hello(node_id, spare=node_id.startswith("s"), incarnation=incarnation,
                 stream_id=hash((node_id, incarnation)) % 97 + 1)


batches = st.lists(st.tuples(st.sampled_from(NODES), st.integers(1, 3)), max_size=4,
                   unique_by=lambda pair: pair[0]).map(lambda pairs: [_hello(n, inc) for n, inc in pairs])


def _after(script: list[tuple[object, float]]) -> tuple[Sim, float]:
    sim = Sim(config(nodes=2, ranks_per_node=2))
    now = NOW
    for inp, step in script:
        now += step
        sim.feed(inp, at=now)  # type: ignore[arg-type]
    return sim, now


def _by_value(events: Sequence[Event]) -> Counter[str]:
    return Counter(repr(event) for event in events)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(inputs, st.floats(0.0, 2.0)), max_size=30), batches, st.floats(0.0, 5.0))
def test_a_batch_of_hellos_decides_what_the_same_hellos_decide_one_by_one(prefix, batch, dt):
    sim, now = _after(prefix)
    one_by_one, _ = _after(prefix)  # the same inputs again: the core is deterministic
    now += dt
    sequential: list[Event] = []
    last_admitted = False
    for position, each in enumerate(batch):
        result = one_by_one.feed(each, at=now)
        last_admitted = isinstance(result, list)
        if isinstance(result, list):
            # The planner runs once per batch: a generation the sequential path starts before
            # the batch's last Hello would be planned with fewer nodes known. Not comparable.
            assume(position == len(batch) - 1 or not any(isinstance(e, GenerationStarted) for e in result))
            sequential += result

    stepped = sim.core.step_hellos([(each, now) for each in batch])
    if not stepped.admitted:  # the runtime decides nothing then (each Hello got its refusal)
        assert sequential == []
        assert stepped.ready.events == ()
        return
    ready = stepped.ready
    batched = evolve_all(sim.state, ready.events)

    assert _by_value(ready.events) == _by_value(sequential)
    assert batched.nodes == one_by_one.state.nodes
    assert batched.generation == one_by_one.state.generation
    assert batched.registrations == one_by_one.state.registrations
    if last_admitted:  # (else the sequential reason is that of an earlier Hello's decision)
        assert ready.waiting_reason == one_by_one.waiting_reason


def test_a_batch_naming_a_node_twice_is_refused():
    sim = Sim(config(nodes=2, ranks_per_node=2))
    try:
        decide_hellos(sim.state, sim.soft, [_hello("n1", 1), _hello("n1", 2)], NOW, sim.config)
    except ValueError as exc:
        assert "at most once" in str(exc)
    else:
        raise AssertionError("a batch naming n1 twice was decided")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(inputs, st.floats(0.0, 2.0)), max_size=40), st.integers(0, 40))
def test_folding_a_batch_equals_folding_one_event_at_a_time_and_leaves_the_input_alone(script, split):
    sim, _ = _after(script)
    events = sim.log
    start = evolve_all(ClusterState(), events[:split])
    before = dict(start.nodes)
    one_at_a_time = start
    for event in events[split:]:
        one_at_a_time = evolve(one_at_a_time, event)
    assert evolve_all(start, events[split:]) == one_at_a_time
    assert dict(start.nodes) == before, "the fold changed the state it was given"


def test_a_folded_batch_is_read_only_and_later_folds_do_not_reach_into_it():
    registered = [NodeRegistered(f"n{i}", 1, _hello("n1", 1).role, "h", 9000, 8) for i in range(3)]
    first = evolve_all(ClusterState(), registered[:2])
    second = evolve_all(first, registered[2:] + [NodeRegistered("n0", 2, registered[0].role, "h", 9000, 8)])
    assert set(first.nodes) == {"n0", "n1"} and first.nodes["n0"].incarnation == 1
    assert set(second.nodes) == {"n0", "n1", "n2"} and second.nodes["n0"].incarnation == 2
    try:
        first.nodes["x"] = first.nodes["n0"]  # type: ignore[index]
    except TypeError:
        pass
    else:
        raise AssertionError("a folded state's node map is writable")


class CountingLog(MemoryLog):
    def __init__(self) -> None:
        super().__init__()
        self.appends: list[int] = []  # events per append

    async def append(self, events: Sequence[Event], **kwargs: object) -> list[Record]:
        self.appends.append(len(events))
        return await super().append(events, **kwargs)  # type: ignore[arg-type]


async def test_hellos_queued_back_to_back_are_appended_together_and_each_is_welcomed():
    log = CountingLog()
    runtime = Runtime(config(nodes=40, ranks_per_node=1), log, tick_s=3600, wall_clock=lambda: 0.0)
    outboxes = {f"n{i:02d}": StreamOutbox() for i in range(40)}
    first = [runtime.submit(hello(n, stream_id=runtime.open_stream(box))) for n, box in list(outboxes.items())[:10]]
    loop = asyncio.create_task(runtime.run())
    try:
        assert not any(o.refusal for o in await asyncio.gather(*first))
        # Queued while the loop is idle: a heartbeat of a registered node rides along, an
        # operator command ends the batch and is decided after it, in order.
        rest = [runtime.submit(hello(n, stream_id=runtime.open_stream(box))) for n, box in list(outboxes.items())[10:25]]
        beat = runtime.submit(Heartbeat("n00", 1, 0))
        drain = runtime.submit(OperatorRequest("drain", "n30", "maintenance", "op"))
        late = [runtime.submit(hello(n, stream_id=runtime.open_stream(box))) for n, box in list(outboxes.items())[25:]]
        runtime.post(Tick())
        outcomes = await asyncio.gather(*rest, beat, *late)
        await drain
    finally:
        loop.cancel()
    assert not any(o.refusal for o in outcomes)
    # 10 Hellos, then 15 more, then the refused drain (n30 unknown yet: nothing appended), then 15.
    assert log.appends[:3] == [10, 15, 15 + 1], log.appends  # the last batch completes the world
    assert set(runtime.state.nodes) == set(outboxes)
    assert runtime.state.generation is not None and len(runtime.state.generation.members) == 40
    for node_id, box in outboxes.items():
        first_message = await asyncio.wait_for(box.get(), 1.0)
        assert first_message is not None and first_message.HasField("welcome"), node_id
