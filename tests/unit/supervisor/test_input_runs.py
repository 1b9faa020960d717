"""A link shard's batch reaches the leader's loop as runs of inputs (runtime.InputRun): one queue
item and one reply per run, each input still decided alone and in order, its answer on its own
node's route; the stream-input bound still counts inputs, and a run cancelled while it waits for
room gives back every slot it took (the class of leak issue 16 found in the buddy)."""

from __future__ import annotations

import asyncio

import pytest

from ftsup.common import step_pack
from ftsup.supervisor.core.events import SnapshotCommitted
from ftsup.supervisor.core.inputs import (
    HeardFrom,
    Heartbeat,
    SnapshotHoldings,
    SnapshotReport,
    StepAggregate,
    StepReport,
    Tick,
)
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.metrics import SupervisorMetrics
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server import relay_service
from ftsup.supervisor.server.relay_service import RelayDown, RelayService, _Relayed
from ftsup.v1 import agent_pb2, shard_pb2
from tests.support.builders import config, hello


async def _registered(nodes: int, capacity: int = 50_000, ranks_per_node: int = 1,
                      log: MemoryLog | None = None) -> Runtime:
    runtime = Runtime(config(nodes=nodes, ranks_per_node=ranks_per_node), log or MemoryLog(), tick_s=3600,
                      wall_clock=lambda: 0.0, stream_input_capacity=capacity)
    for i in range(nodes):
        assert (await runtime._handle(hello(f"n{i}", stream_id=runtime.open_stream(StreamOutbox())))).refusal is None
    await runtime._handle(Tick())
    assert runtime.state.generation is not None
    return runtime


def _count_folds(runtime: Runtime, method: str) -> list[int]:
    """The sizes of the folds the core is asked to decide through `method` (its own, counted)."""
    folds: list[int] = []
    decide_together = getattr(runtime.core, method)

    def counted(parts, now, *rest, **named):
        folds.append(len(parts))
        return decide_together(parts, now, *rest, **named)

    setattr(runtime.core, method, counted)
    return folds


async def test_a_runs_inputs_are_decided_in_order_each_with_its_own_outcome():
    runtime = await _registered(2)
    loop = asyncio.create_task(runtime.run())
    try:
        run = [StepReport("n0", 1, 0, 1, 0.5, 0.4, 2.0, "d"), StepReport("ghost", 1, 0, 1, 0.5, 0.4, 2.0, "d"),
               Heartbeat("n1", 1, 1), StepReport("n1", 1, 1, 1, 0.5, 0.4, 2.0, "d")]
        outcomes = await asyncio.wait_for(await runtime.submit_run_from_stream(run), 5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert [o.refusal is None for o in outcomes] == [True, False, True, True]
    assert "ghost" in (outcomes[1].refusal or "")
    assert runtime.state.generation is not None and runtime.state.generation.is_running  # (the first report)
    assert runtime.soft.progress is not None and runtime.soft.progress.max_step == 1
    assert runtime._stream_slots.free == 50_000, "every slot given back"


async def test_a_runs_step_aggregates_of_one_step_are_decided_as_one_fold_with_their_own_outcomes():
    """Nodes' aggregates of one step back to back (a heartbeat among them) are one fold: one
    append for what they decide, each refusal on its own part; a part of another step, or a
    node's second part, starts another fold; the step is voted on exactly once."""
    runtime = await _registered(4)
    folds = _count_folds(runtime, "step_aggregates")
    loop = asyncio.create_task(runtime.run())

    def part(node: int, step: int, compute_s: float = 0.4) -> StepAggregate:
        return StepAggregate.of_reports([StepReport(f"n{node}", 1, node, step, 0.5, compute_s, 2.0, f"d{step}")])

    try:
        run = [part(0, 1), part(1, 1), Heartbeat("n3", 1, 1), part(2, 1, compute_s=-1.0), part(3, 1),
               part(0, 2), part(1, 2), part(1, 2)]
        outcomes = await asyncio.wait_for(await runtime.submit_run_from_stream(run), 5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert [o.refusal is None for o in outcomes] == [True, True, True, False, True, True, True, True]
    assert "compute_time_s" in (outcomes[3].refusal or "")
    assert folds == [4, 2], "step 1's four parts, then step 2's first two (n1's second part alone)"
    progress = runtime.soft.progress
    assert progress is not None and progress.max_step == 2 and progress.step_reports == 3 + 3
    assert 1 not in progress.sdc_clear_steps, "n2's refused part left step 1 incomplete: no vote"
    assert runtime._stream_slots.free == 50_000, "every slot given back"


async def test_a_runs_holdings_of_one_step_are_decided_as_one_fold_and_the_commit_is_appended_once():
    """Nodes' SnapshotHoldings of one step back to back (a heartbeat among them) are one fold, each
    refusal on its own part; the fold ends at the part that completes the step, and the parts
    after it are decided alone, after the commit."""
    log = MemoryLog()
    runtime = await _registered(4, log=log)
    folds = _count_folds(runtime, "step_holdings")
    generation = runtime.state.generation
    assert generation is not None
    loop = asyncio.create_task(runtime.run())

    def held(node: str, step: int = 1) -> SnapshotHoldings:
        ranks = [m.ranks[0] for m in generation.members if node in (m.node_id, m.buddy_node_id)]
        return SnapshotHoldings.of_reports([SnapshotReport(node, 1, r, step, (node,), 10, f"s{r}")
                                            for r in sorted(ranks)])

    try:
        steps = [StepAggregate.of_reports([StepReport(f"n{i}", 1, i, 1, 0.5, 0.4, 2.0, "d")]) for i in range(4)]
        await asyncio.wait_for(await runtime.submit_run_from_stream(steps), 5.0)
        stranger = SnapshotHoldings("ghost", 1, 1, (0,), (10,), ("s0",))
        run = [held("n0"), Heartbeat("n3", 1, 1), stranger, held("n1"), held("n2"), held("n3"), held("n0")]
        outcomes = await asyncio.wait_for(await runtime.submit_run_from_stream(run), 5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert [o.refusal is None for o in outcomes] == [True, True, False, True, True, True, True]
    assert "ghost" in (outcomes[2].refusal or "")
    assert folds == [5], "n0..n3 and the stranger in one fold; n0's second holdings (its node again) alone"
    snapshot = runtime.state.snapshot
    assert snapshot is not None and snapshot.step == 1
    assert sum(isinstance(r.event, SnapshotCommitted) for r in log.read()) == 1
    assert runtime._stream_slots.free == 50_000, "every slot given back"


async def test_a_shards_liveness_summary_is_decided_before_the_inputs_queued_ahead_of_it():
    """A summary (HeardFrom) queued behind a run of reports and a Tick is taken first, so the acks
    it releases do not wait for a step's burst; the rest keep their arrival order."""
    runtime = await _registered(2)
    done: list[str] = []
    run = await runtime.submit_run_from_stream([StepReport("n0", 1, 0, 1, 0.5, 0.4, 2.0, "d")] * 3)
    run.add_done_callback(lambda _: done.append("run"))
    tick = runtime.submit(Tick())
    tick.add_done_callback(lambda _: done.append("tick"))
    heard = runtime.submit(HeardFrom(("n0", "n1"), "shard-a"))
    heard.add_done_callback(lambda _: done.append("heard"))
    loop = asyncio.create_task(runtime.run())
    try:
        await asyncio.wait_for(asyncio.gather(run, tick, heard), 5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert done == ["heard", "run", "tick"]
    assert heard.result().refusal is None


async def test_a_run_cancelled_while_it_waits_for_room_holds_no_slot():
    runtime = await _registered(1, capacity=3)
    first = await runtime.submit_run_from_stream([Heartbeat("n0", 1, 1), Heartbeat("n0", 1, 2)])  # 2 of 3 slots
    waiting = asyncio.create_task(runtime.submit_run_from_stream([Heartbeat("n0", 1, 3), Heartbeat("n0", 1, 4)]))
    await asyncio.sleep(0)  # (it waits for room for both: it takes its slots at once)
    assert runtime._stream_slots.free == 1
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert runtime._stream_slots.free == 1, "the cancelled run took nothing"
    loop = asyncio.create_task(runtime.run())
    try:
        assert all(o.refusal is None for o in await asyncio.wait_for(first, 5.0))
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert runtime._stream_slots.free == 3
    with pytest.raises(ValueError, match="exceeds the stream capacity"):
        await runtime.submit_run_from_stream([Heartbeat("n0", 1, 5)] * 4)


class _Batches:
    """A relay's incoming stream: the given ShardBatches, then the end."""

    def __init__(self, *batches: shard_pb2.ShardBatch) -> None:
        self._batches = list(batches)

    def __aiter__(self) -> _Batches:
        return self

    async def __anext__(self) -> shard_pb2.ShardBatch:
        if not self._batches:
            raise StopAsyncIteration
        return self._batches.pop(0)


def _item(session: int, node_id: str, **message: object) -> shard_pb2.Forwarded:
    return shard_pb2.Forwarded(session=session, node_id=node_id, incarnation=1,
                               message=agent_pb2.AgentMessage(**message))  # type: ignore[arg-type]


async def test_a_shards_batch_goes_to_the_loop_as_one_run_and_each_node_hears_its_own_answer(monkeypatch):
    runtime = await _registered(3)
    service, down = RelayService(runtime), RelayDown()
    routes = {i: relay_service.RelayRoute(down, session=i) for i in range(3)}
    sessions = {i: _Relayed(runtime.open_stream(routes[i]), f"n{i}", 1, routes[i]) for i in range(3)}
    runs: list[int] = []
    submit = runtime.submit_run_from_stream

    async def counted(inputs):  # type: ignore[no-untyped-def]
        runs.append(len(inputs))
        return await submit(inputs)

    monkeypatch.setattr(runtime, "submit_run_from_stream", counted)
    report = agent_pb2.StepReport(generation=1, rank=0, step=1, step_time_s=0.5, compute_time_s=0.4, loss=2.0,
                                  param_digest="d")
    bad = agent_pb2.StepReport(generation=1, rank=2, step=1, step_time_s=-1.0, compute_time_s=0.4, loss=2.0,
                               param_digest="d")
    batch = shard_pb2.ShardBatch(items=[
        _item(0, "n0", step_report=report),
        _item(1, "n1", heartbeat=agent_pb2.Heartbeat(seq=7, want_ack=True)),
        _item(2, "n2", step_report=bad),
        shard_pb2.Forwarded(session=2, node_id="n2", incarnation=1, closed=shard_pb2.ShardSessionEnd()),
        _item(1, "n1", xid_event=agent_pb2.XidEvent(code=13, pci="0000:01:00.0", message="x")),
    ])
    loop = asyncio.create_task(runtime.run())
    try:
        await service._read(_Batches(batch), down, sessions, "shard-a")
        await asyncio.wait_for(_until(lambda: len(down) >= 2 and "n1" in runtime.soft.xids), 5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert runs == [3], "the three messages before the closed stream went as one run; the Xid after it alone"
    answers = [(item.session, item.message.WhichOneof("kind")) for item in down.take()]
    assert (1, "heartbeat_ack") in answers and (2, "refusal") in answers, answers
    assert [a for a in answers if a[1] == "refusal"] == [(2, "refusal")], "only n2's report was refused"
    assert [s.code for s in runtime.soft.xids["n1"]] == [13], "the Xid after the close, admitted alone"


async def test_a_shards_batch_of_its_nodes_step_aggregates_is_decided_as_one_fold_each_answered_alone():
    """Four nodes' aggregates of one step in a shard's batch (a heartbeat among them, one node's
    figures out of bounds) reach the core as one fold: the leader's metrics count it, the bad
    node alone hears a refusal, the heartbeat its ack, and the step waits for the refused ranks."""
    runtime = await _registered(4, ranks_per_node=2)
    runtime.metrics = SupervisorMetrics()
    service, down = RelayService(runtime), RelayDown()
    routes = {i: relay_service.RelayRoute(down, session=i) for i in range(4)}
    sessions = {i: _Relayed(runtime.open_stream(routes[i]), f"n{i}", 1, routes[i]) for i in range(4)}
    generation = runtime.state.generation
    assert generation is not None

    def aggregate(node: int, step_time_s: float = 0.5) -> agent_pb2.StepAggregate:
        member = generation.member(f"n{node}")
        assert member is not None
        return step_pack.pack([agent_pb2.StepReport(generation=1, rank=rank, step=1, step_time_s=step_time_s,
                                                    compute_time_s=0.4, loss=2.0, param_digest="d")
                               for rank in member.ranks])

    batch = shard_pb2.ShardBatch(items=[
        _item(0, "n0", step_aggregate=aggregate(0)),
        _item(1, "n1", step_aggregate=aggregate(1)),
        _item(3, "n3", heartbeat=agent_pb2.Heartbeat(seq=4, want_ack=True)),
        _item(2, "n2", step_aggregate=aggregate(2, step_time_s=-1.0)),
        _item(3, "n3", step_aggregate=aggregate(3)),
    ])
    loop = asyncio.create_task(runtime.run())
    try:
        await service._read(_Batches(batch), down, sessions, "shard-a")
        await asyncio.wait_for(_until(lambda: len(down) >= 2), 5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert runtime.metrics.step_folds._value.get() == 1 and runtime.metrics.step_folded._value.get() == 4
    answers = [(item.session, item.message.WhichOneof("kind")) for item in down.take()]
    assert sorted(answers) == [(2, "refusal"), (3, "heartbeat_ack")], answers
    progress = runtime.soft.progress
    assert progress is not None and progress.step_reports == 6 and 1 not in progress.sdc_clear_steps


async def _until(check) -> None:  # type: ignore[no-untyped-def]
    while not check():
        await asyncio.sleep(0.01)
