"""A link shard's packed holdings fold (ShardHoldingsFold, issue 14): the shard packs its sessions'
back-to-back SnapshotHoldings of one step into one message (common/holdings_fold_pack.py,
shard_queue.pack_holdings) and the leader decodes it once into the parts
(supervisor/server/holdings_fold.py): each part is what its node's own message decodes to, so it is
admitted, refused and decided as that message would be; every session's messages keep their order
through both packings (aggregates, then holdings)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.common import holdings_fold_pack, holdings_pack, step_pack
from ftsup.supervisor.core.events import SnapshotCommitted
from ftsup.supervisor.core.inputs import HoldingsFold
from ftsup.supervisor.core.limits import MAX_RANKS_PER_NODE_REPORT
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.server import holdings_fold, relay_service, snapshot_holdings
from ftsup.supervisor.server.relay_service import RelayDown, RelayService, _Relayed
from ftsup.supervisor.shard_queue import UpQueue, forwarded, pack_holdings, pack_step_aggregates
from ftsup.v1 import agent_pb2, shard_pb2
from tests.unit.supervisor.test_input_runs import _Batches, _registered, _until
from tests.unit.supervisor.test_step_fold_wire import _expand as expand_steps


def _holdings(step: int, ranks: list[int], generation: int = 1) -> agent_pb2.SnapshotHoldings:
    return holdings_pack.pack([agent_pb2.SnapshotReport(generation=generation, rank=r, step=step, size_bytes=100 + r,
                                                        sha256=f"s{r}") for r in ranks])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**9))
def test_a_packed_fold_decodes_to_each_nodes_own_holdings(seed):
    rng = random.Random(seed)
    parts = [(session, _holdings(7, rng.sample(range(64), rng.randint(1, 8))))
             for session in rng.sample(range(1, 1000), rng.randint(1, 6))]
    fold = shard_pb2.ShardHoldingsFold.FromString(holdings_fold_pack.pack(parts).SerializeToString())
    nodes = [f"n{session}" for session, _ in parts]
    own = [snapshot_holdings.to_input(node, message) for node, (_, message) in zip(nodes, parts)]
    columns = holdings_fold.to_input(nodes, fold)
    assert columns.parts() == own
    assert [columns.part(i) for i in range(len(own))] == own and columns.part(-1) == own[-1]
    again = HoldingsFold.of_parts(own)  # (what the loop folds the leader's own nodes' messages into)
    assert again.parts() == own and again.counts == columns.counts and again.sha256 == columns.sha256
    assert holdings_fold_pack.unpack(fold) == parts


def test_a_fold_whose_parts_do_not_fit_together_is_refused_whole():
    good = holdings_fold_pack.pack([(1, _holdings(7, [0, 1])), (2, _holdings(7, [2]))])
    with pytest.raises(holdings_fold.MalformedHoldings, match="2 parts for 3 sessions"):
        holdings_fold.to_input(["a", "b", "c"], good)
    short = shard_pb2.ShardHoldingsFold()
    short.CopyFrom(good)
    short.sha256.pop()
    with pytest.raises(holdings_fold.MalformedHoldings, match="3 entries has 3 ranks, 3 sizes and 2 digests"):
        holdings_fold.to_input(["a", "b"], short)
    empty = shard_pb2.ShardHoldingsFold(sessions=[1], counts=[0])
    with pytest.raises(holdings_fold.MalformedHoldings, match="a part of no ranks"):
        holdings_fold.to_input(["a"], empty)
    with pytest.raises(ValueError, match="each session's holdings of one generation's step once"):
        holdings_fold_pack.pack([(1, _holdings(7, [0])), (2, _holdings(8, [1]))])


def _aggregate(step: int, ranks: tuple[int, ...]) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(step_aggregate=step_pack.pack([
        agent_pb2.StepReport(generation=1, rank=r, step=step, step_time_s=1.0, compute_time_s=0.5, loss=2.0,
                             param_digest=f"d{step}") for r in ranks]))


def _expand(items: list[shard_pb2.Forwarded]) -> list[tuple[int, str, object]]:
    """Every session's messages, each packed fold's parts in its place, as the leader decodes them
    (holdings here, the rest as test_step_fold_wire reads them)."""
    out: list[tuple[int, str, object]] = []
    for item in items:
        kind = item.WhichOneof("kind")
        if kind == "holdings_fold":
            sessions = list(item.holdings_fold.sessions)
            held = holdings_fold.to_input([str(s) for s in sessions], item.holdings_fold).parts()
            out.extend((s, "snapshot_holdings", part) for s, part in zip(sessions, held))
        elif kind == "message" and item.message.WhichOneof("kind") == "snapshot_holdings":
            out.append((item.session, "snapshot_holdings",
                        snapshot_holdings.to_input(str(item.session), item.message.snapshot_holdings)))
        else:
            out.extend(expand_steps([item]))
    return out


def _per_session(items: list[shard_pb2.Forwarded]) -> dict[int, list[tuple[int, str, object]]]:
    out: dict[int, list[tuple[int, str, object]]] = {}
    for entry in _expand(items):
        out.setdefault(entry[0], []).append(entry)
    return out


def _packed_both_ways(items: list[shard_pb2.Forwarded]) -> list[shard_pb2.Forwarded]:
    return pack_holdings(pack_step_aggregates(items))


def test_a_step_whose_nodes_each_send_an_aggregate_holdings_and_copies_goes_up_as_two_folds():
    items = []
    for session in range(1, 5):
        own = [2 * session, 2 * session + 1]
        copies = [2 * (session % 4 + 1), 2 * (session % 4 + 1) + 1]
        items += [forwarded(session, f"n{session}", 1, _aggregate(5, tuple(own))),
                  forwarded(session, f"n{session}", 1, agent_pb2.AgentMessage(snapshot_holdings=_holdings(5, own))),
                  forwarded(session, f"n{session}", 1, agent_pb2.AgentMessage(snapshot_holdings=_holdings(5, copies)))]
    packed = _packed_both_ways(items)
    shape = [(i.WhichOneof("kind"), list(getattr(i, i.WhichOneof("kind")).sessions)) if "fold" in
             (i.WhichOneof("kind") or "") else i.session for i in packed]
    # The aggregates in one fold; each node's holdings, then (its session again) its copies.
    assert shape == [("step_fold", [1, 2, 3, 4]), ("holdings_fold", [1, 2, 3, 4]), ("holdings_fold", [1, 2, 3, 4])]
    assert _per_session(packed) == _per_session(items)
    oversized = forwarded(9, "n9", 1, agent_pb2.AgentMessage(
        snapshot_holdings=_holdings(5, list(range(MAX_RANKS_PER_NODE_REPORT + 1)))))
    alone = pack_holdings([items[1], oversized, items[4]])
    assert [i.WhichOneof("kind") for i in alone] == ["holdings_fold", "message"], \
        "what the leader would refuse goes up alone, behind the others' fold"


MESSAGES = st.lists(st.tuples(st.integers(1, 4), st.sampled_from(["agg5", "held5", "held5", "held6", "xid", "copies5"])),
                    max_size=30)


@settings(max_examples=150, deadline=None)
@given(MESSAGES)
def test_packing_both_kinds_keeps_every_message_and_each_sessions_order(script):
    items = []
    for session, what in script:
        if what == "xid":
            message = agent_pb2.AgentMessage(xid_event=agent_pb2.XidEvent(code=session))
        elif what == "agg5":
            message = _aggregate(5, (2 * session, 2 * session + 1))
        else:
            ranks = [2 * session, 2 * session + 1] if what != "copies5" else [20 + session]
            message = agent_pb2.AgentMessage(snapshot_holdings=_holdings(6 if what == "held6" else 5, ranks))
        items.append(forwarded(session, f"n{session}", 1, message))
    packed = _packed_both_ways(items)
    assert _per_session(packed) == _per_session(items)  # every message once, each session's in its order
    again = pack_step_aggregates(pack_holdings(packed))  # (a batch put back and taken again)
    assert _per_session(again) == _per_session(items)
    for item in packed:
        if item.WhichOneof("kind") == "holdings_fold":
            assert len(set(item.holdings_fold.sessions)) == len(item.holdings_fold.sessions) > 1


def test_the_up_queue_packs_holdings_only_for_a_leader_that_takes_holdings_folds():
    def queued() -> UpQueue:
        queue = UpQueue()
        for session in (1, 2, 3):
            queue.push(forwarded(session, f"n{session}", 1,
                                 agent_pb2.AgentMessage(snapshot_holdings=_holdings(5, [session]))))
        return queue

    assert [i.WhichOneof("kind") for i in queued().take(folds_holdings=True, packs_steps=True)] == ["message"] * 3
    queue = queued()
    assert [i.WhichOneof("kind") for i in queue.take(folds_holdings=True, packs_holdings=True)] == ["holdings_fold"]
    assert queue.holdings_packed == 2


def _relayed(runtime: Any) -> tuple[RelayService, RelayDown, dict[int, _Relayed], Any, dict[int, list[int]]]:
    """A relay over `runtime` whose four sessions are its nodes n0..n3, the generation in force
    and each node's own ranks."""
    service, down = RelayService(runtime), RelayDown()
    routes = {i: relay_service.RelayRoute(down, session=i) for i in range(4)}
    sessions = {i: _Relayed(runtime.open_stream(routes[i]), f"n{i}", 1, routes[i]) for i in range(4)}
    generation = runtime.state.generation
    assert generation is not None
    own = {i: list(generation.member(f"n{i}").ranks) for i in range(4)}
    return service, down, sessions, generation, own


async def test_the_relay_decides_a_packed_holdings_fold_and_answers_each_part_on_its_own_route():
    """Four nodes' holdings and copies of a voted step, packed by their shard (one node names a
    rank it may not hold): the step commits, the bad node alone hears a refusal, and a part of a
    session the leader does not know is dropped as its message would be."""
    log = MemoryLog()
    runtime = await _registered(4, ranks_per_node=2, log=log)
    service, down, sessions, generation, own = _relayed(runtime)
    copies = {i: [r for m in generation.members if m.buddy_node_id == f"n{i}" for r in m.ranks] for i in range(4)}
    steps = shard_pb2.ShardBatch(items=[forwarded(i, f"n{i}", 1, _aggregate(1, tuple(own[i]))) for i in range(4)])
    foreign = next(r for r in range(8) if r not in own[2] + copies[2])
    fold = holdings_fold_pack.pack([(0, _holdings(1, own[0] + copies[0])), (9, _holdings(1, [0])),
                                    (1, _holdings(1, own[1] + copies[1])), (2, _holdings(1, [foreign])),
                                    (3, _holdings(1, own[3] + copies[3]))])
    late = holdings_fold_pack.pack([(2, _holdings(1, own[2] + copies[2]))] * 1 + [(3, _holdings(1, own[3]))])
    batch = shard_pb2.ShardBatch(items=[shard_pb2.Forwarded(holdings_fold=fold), shard_pb2.Forwarded(holdings_fold=late)])
    loop = asyncio.create_task(runtime.run())
    try:
        await service._read(_Batches(steps, batch), down, sessions, "shard-a")
        await asyncio.wait_for(_until(lambda: runtime.state.snapshot is not None and len(down) >= 1), 5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    snapshot = runtime.state.snapshot
    assert snapshot is not None and snapshot.step == 1
    assert sum(isinstance(r.event, SnapshotCommitted) for r in log.read()) == 1
    answers = [(item.session, item.message.WhichOneof("kind")) for item in down.take()]
    refusals = [a for a in answers if a[1] == "refusal"]
    assert refusals == [(2, "refusal")], answers


async def test_a_usual_fold_is_decided_on_its_columns_and_a_bad_part_is_refused_on_its_own_route(monkeypatch):
    """Over the relay, a fold of known sessions none of whose parts completes the step is decided
    whole on its columns (Core.step_holdings_fold, no part refused); a fold with a part naming a
    rank its node may not hold goes part by part, and only that node hears a refusal."""
    runtime = await _registered(4, ranks_per_node=2, log=MemoryLog())
    whole: list[bool] = []
    step_holdings_fold = runtime.core.step_holdings_fold

    def spied(fold: HoldingsFold, now: float) -> object:
        stepped = step_holdings_fold(fold, now)
        whole.append(stepped is not None)
        return stepped

    monkeypatch.setattr(runtime.core, "step_holdings_fold", spied)
    service, down, sessions, generation, own = _relayed(runtime)
    usual = holdings_fold_pack.pack([(0, _holdings(1, own[0])), (1, _holdings(1, own[1]))])
    copies = [r for m in generation.members if m.buddy_node_id == "n3" for r in m.ranks]
    foreign = next(r for r in range(8) if r not in own[3] + copies)
    bad = holdings_fold_pack.pack([(2, _holdings(1, own[2])), (3, _holdings(1, [foreign]))])
    batch = shard_pb2.ShardBatch(items=[shard_pb2.Forwarded(holdings_fold=usual), shard_pb2.Forwarded(holdings_fold=bad)])
    loop = asyncio.create_task(runtime.run())
    try:
        await service._read(_Batches(batch), down, sessions, "shard-a")
        await asyncio.wait_for(_until(lambda: len(down) >= 1), 5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert whole[0] is True, "the usual fold is decided whole"
    assert whole[1:] == [False], "the fold with a bad part is not, and is not asked again part by part"
    progress = runtime.soft.progress
    assert progress is not None and progress.holdings[1].pairs == 6, "n0, n1 and n2 hold their own two ranks"
    answers = [(item.session, item.message.WhichOneof("kind")) for item in down.take()]
    assert answers == [(3, "refusal")], answers
