"""A link shard's packed step fold (ShardStepFold, issue 14): the shard packs its sessions'
back-to-back aggregates of one step into one message (common/step_fold_pack.py,
shard_queue.pack_step_aggregates) and the leader decodes it once into the parts and their fold
(supervisor/server/step_fold.py). The parts are what the per-node messages decode to, the fold
what the core would have made of them, and the leader decides, refuses and records exactly what
the same per-node messages decide one by one."""

from __future__ import annotations

import asyncio
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.common import step_fold_pack, step_pack
from ftsup.supervisor.core.events import SdcSuspected, StragglerDetected
from ftsup.supervisor.core.inputs import StepAggregate
from ftsup.supervisor.metrics import SupervisorMetrics
from ftsup.supervisor.server import relay_service, step_aggregate, step_fold
from ftsup.supervisor.server.relay_service import RelayDown, RelayService, _Relayed
from ftsup.supervisor.shard_queue import UpQueue, forwarded, pack_step_aggregates
from ftsup.v1 import agent_pb2, shard_pb2
from tests.support.builders import NOW, Sim
from tests.support.step_scripts import STEP_SCRIPTS, assert_same_decisions
from tests.unit.supervisor.test_input_runs import _Batches, _registered, _until
from tests.unit.supervisor.test_step_folds import _parts, _runs, _started


def _decoded(node_ids: list[str], message: shard_pb2.ShardStepFold) -> tuple[list[StepAggregate], StepAggregate]:
    """A packed fold as the leader decodes it (step_fold.to_fold), with its parts (`parts()`: what
    the leader makes of a fold it does not decide whole)."""
    fold = step_fold.to_fold(node_ids, message)
    return fold.parts(), fold


def _wire(part: StepAggregate) -> agent_pb2.StepAggregate:
    """A core aggregate as its node's agent sends it."""
    return step_aggregate.to_proto(part.reports())


def _groups(groups: tuple[object, ...]) -> list[tuple[str, list[int]]]:
    return [(g.digest, g.positions.tolist()) for g in groups]  # type: ignore[attr-defined]


def _assert_same_aggregate(got: StepAggregate, want: StepAggregate) -> None:
    assert got.reports() == want.reports()
    assert (got.node_id, got.generation, got.step, got.segments) == (want.node_id, want.generation, want.step,
                                                                      want.segments)
    assert _groups(got.param_digests) == _groups(want.param_digests)
    assert _groups(got.local_grad_digests) == _groups(want.local_grad_digests)
    for name in ("ranks", "step_time_s", "compute_time_s", "loss", "grad_norm", "tokens", "replica_groups"):
        got_values, want_values = getattr(got, name), getattr(want, name)
        assert got_values.dtype == want_values.dtype, name
        assert np.array_equal(got_values, want_values, equal_nan=True), name
        assert not got_values.flags.writeable, name


# -- round trips -------------------------------------------------------------------------------------

def _random_messages(rng: random.Random) -> list[agent_pb2.StepAggregate]:
    """A step's aggregates of 1-6 nodes (1-5 ranks each), each optional figure reported by all,
    some or none of a node's ranks (grad_norm, tokens, replica_group, local_grad_digest) and a few
    parameter digests, as agents pack them (common/step_pack.py)."""
    messages, rank = [], 0
    for _ in range(rng.randint(1, 6)):
        norms, tokens, groups, grads = (rng.choice(["none", "all", "some"]) for _ in range(4))
        reports = []
        for _ in range(rng.randint(1, 5)):
            report = agent_pb2.StepReport(generation=3, rank=rank, step=7, step_time_s=rng.uniform(0.5, 1.0),
                                          compute_time_s=rng.uniform(0.1, 0.5), loss=rng.uniform(1, 3),
                                          param_digest=rng.choice(["p", "p", "q", "r"]))
            if norms == "all" or norms == "some" and rng.random() < 0.5:
                report.grad_norm = rng.choice([rng.uniform(0, 2), math.inf])
            if tokens == "all" or tokens == "some" and rng.random() < 0.5:
                report.tokens = rng.randint(1, 10**6)
            if groups == "all" or groups == "some" and rng.random() < 0.5:
                report.replica_group = rng.randint(0, rank)
            if grads == "all" or grads == "some" and rng.random() < 0.5:
                report.local_grad_digest = rng.choice(["g", "h", "g"])
            reports.append(report)
            rank += 1
        messages.append(step_pack.pack(reports))
    return messages


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**9))
def test_a_packed_fold_decodes_to_the_per_node_aggregates_and_their_fold(seed):
    messages = _random_messages(random.Random(seed))
    nodes = [f"n{i}" for i in range(len(messages))]
    packed = step_fold_pack.pack([(i + 10, m) for i, m in enumerate(messages)])
    wire = shard_pb2.ShardStepFold.FromString(packed.SerializeToString())  # (as the leader receives it)
    assert list(wire.sessions) == [i + 10 for i in range(len(messages))]
    parts, fold = _decoded(nodes, wire)
    want = [step_aggregate.to_input(node, m) for node, m in zip(nodes, messages)]
    assert len(parts) == len(want)
    for got, expected in zip(parts, want):
        _assert_same_aggregate(got, expected)
    if len(want) > 1:
        _assert_same_aggregate(fold, StepAggregate.fold(want))
    else:
        assert fold.reports() == want[0].reports() and fold.segments == ((nodes[0], len(want[0])),)


def test_optional_arrays_are_sent_only_when_some_part_reported_them():
    def node(first_rank: int, **optional: object) -> agent_pb2.StepAggregate:
        return step_pack.pack([agent_pb2.StepReport(generation=1, rank=r, step=2, step_time_s=1.0, compute_time_s=0.5,
                                                    loss=2.0, param_digest="p", **optional)  # type: ignore[arg-type]
                               for r in (first_rank, first_rank + 1)])

    bare = step_fold_pack.pack([(1, node(0)), (2, node(2))])
    assert (bare.grad_norm, bare.tokens, bare.replica_groups, list(bare.local_grad_digests)) == (b"", b"", b"", [])
    parts, fold = _decoded(["a", "b"], bare)
    assert np.isnan(fold.grad_norm).all() and (fold.tokens == 0).all() and (fold.replica_groups == -1).all()
    assert fold.local_grad_digests == () and all(p.local_grad_digests == () for p in parts)
    assert len(bare.param_digests) == 1 and all(p.param_digests[0].positions.tolist() == [0, 1] for p in parts)

    mixed = step_fold_pack.pack([(1, node(0)), (2, node(2, grad_norm=0.5, tokens=9, replica_group=1,
                                                       local_grad_digest="g"))])
    parts, fold = _decoded(["a", "b"], mixed)
    assert fold.grad_norm[:2].tolist() != fold.grad_norm[:2].tolist()  # (NaN: the first part reported none)
    assert fold.grad_norm[2:].tolist() == [0.5, 0.5] and fold.tokens.tolist() == [0, 0, 9, 9]
    assert fold.replica_groups.tolist() == [-1, -1, 1, 1]
    assert _groups(fold.local_grad_digests) == [("g", [2, 3])]
    assert parts[0].local_grad_digests == () and _groups(parts[1].local_grad_digests) == [("g", [0, 1])]
    assert [p.reports() for p in parts] == [step_aggregate.to_input(n, m).reports()
                                            for n, m in zip("ab", (node(0), node(2, grad_norm=0.5, tokens=9,
                                                                                     replica_group=1,
                                                                                     local_grad_digest="g")))]


def test_a_fold_whose_parts_do_not_fit_together_is_refused_whole():
    good = step_fold_pack.pack([(1, step_aggregate.to_proto(_started_parts()[0].reports())),
                                (2, step_aggregate.to_proto(_started_parts()[1].reports()))])
    with pytest.raises(step_aggregate.MalformedAggregate):
        _decoded(["a"], good)  # one node for two parts
    for field, value in (("counts", good.counts[:-4]), ("loss", good.loss[:-8]), ("ranks", good.ranks + b"\0"),
                         ("tokens", b"\0" * 8)):
        broken = shard_pb2.ShardStepFold()
        broken.CopyFrom(good)
        setattr(broken, field, value)
        with pytest.raises(step_aggregate.MalformedAggregate):
            _decoded(["a", "b"], broken)
    uncovered = shard_pb2.ShardStepFold()
    uncovered.CopyFrom(good)
    uncovered.param_digests[0].positions = uncovered.param_digests[0].positions[:-4]
    with pytest.raises(step_aggregate.MalformedAggregate, match="param_digests"):
        _decoded(["a", "b"], uncovered)


def _started_parts() -> list[StepAggregate]:
    sim = _started()
    return _parts(sim, 1, None, None, random.Random(0), faults=False)


# -- the shard packs only back-to-back aggregates of one step ------------------------------------------

def _aggregate(step: int, ranks: tuple[int, ...], generation: int = 1) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(step_aggregate=step_pack.pack([
        agent_pb2.StepReport(generation=generation, rank=r, step=step, step_time_s=1.0, compute_time_s=0.5, loss=2.0,
                             param_digest=f"d{step}") for r in ranks]))


def _expand(items: list[shard_pb2.Forwarded]) -> list[tuple[int, str, object]]:
    """Every session's messages, a packed fold's parts each in its place (reports as decoded)."""
    out: list[tuple[int, str, object]] = []
    for item in items:
        kind = item.WhichOneof("kind")
        if kind == "step_fold":
            sessions = list(item.step_fold.sessions)
            parts, _ = _decoded([str(s) for s in sessions], item.step_fold)
            out.extend((s, "step_aggregate", part.reports()) for s, part in zip(sessions, parts))
        elif kind == "message" and item.message.WhichOneof("kind") == "step_aggregate":
            try:
                reports: object = step_aggregate.to_input(str(item.session), item.message.step_aggregate).reports()
            except step_aggregate.MalformedAggregate:
                reports = item.message.step_aggregate
            out.append((item.session, "step_aggregate", reports))
        else:
            out.append((item.session, kind if kind != "message" else item.message.WhichOneof("kind") or "", None))
    return out


def _per_session(items: list[shard_pb2.Forwarded]) -> dict[int, list[tuple[int, str, object]]]:
    """Each session's messages in their order (what packing must keep; across sessions it may move)."""
    out: dict[int, list[tuple[int, str, object]]] = {}
    for entry in _expand(items):
        out.setdefault(entry[0], []).append(entry)
    return out


def test_the_shard_packs_aggregates_of_one_step_of_distinct_sessions_past_other_sessions_items():
    malformed = _aggregate(5, (6,))
    malformed.step_aggregate.loss.append(1.0)  # (two losses for one rank: the leader refuses it to its node)
    items = [
        forwarded(1, "a", 1, _aggregate(5, (0, 1))),
        forwarded(2, "b", 1, _aggregate(5, (2, 3))),   # 1-2: packed
        forwarded(3, "c", 1, _aggregate(6, (4, 5))),   # another step: its own
        forwarded(4, "d", 1, _aggregate(5, (6, 7))),
        forwarded(5, "e", 1, _aggregate(5, (8, 9))),
        forwarded(4, "d", 1, _aggregate(5, (6, 7))),   # 4-5 packed; d again starts another
        forwarded(6, "f", 1, _aggregate(5, (10, 11))),  # d-f packed
        forwarded(7, "g", 1, agent_pb2.AgentMessage(xid_event=agent_pb2.XidEvent(code=13))),
        forwarded(8, "h", 1, _aggregate(5, (12, 13))),  # d, f and h packed, g's Xid behind them
        forwarded(9, "i", 1, malformed),              # malformed: alone, behind the fold
        forwarded(10, "j", 1, _aggregate(5, (14, 15), generation=2)),
        forwarded(11, "k", 1, _aggregate(5, (16, 17))),  # another generation: each alone
        forwarded(11, "k", 1),                         # (the end of k's session)
    ]
    packed = pack_step_aggregates(items)
    shape = [list(i.step_fold.sessions) if i.WhichOneof("kind") == "step_fold" else i.session for i in packed]
    assert shape == [[1, 2], 3, [4, 5], [4, 6, 8], 7, 9, 10, 11, 11]
    assert packed[-4].message == malformed
    assert _per_session(packed) == _per_session(items)
    assert pack_step_aggregates(items[:1]) == items[:1]
    assert [len(i.step_fold.sessions) for i in pack_step_aggregates(items[3:5] + items[6:7], max_parts=2)] == [2, 0]


def test_a_step_whose_nodes_each_send_their_aggregate_and_holdings_goes_up_as_one_fold_and_the_holdings():
    holdings = agent_pb2.AgentMessage(snapshot_holdings=agent_pb2.SnapshotHoldings())
    items = []
    for session in range(1, 5):
        items += [forwarded(session, f"n{session}", 1, _aggregate(5, (2 * session, 2 * session + 1))),
                  forwarded(session, f"n{session}", 1, holdings)]
    packed = pack_step_aggregates(items)
    assert [list(i.step_fold.sessions) if i.WhichOneof("kind") == "step_fold" else i.session for i in packed] == \
        [[1, 2, 3, 4], 1, 2, 3, 4]
    assert _per_session(packed) == _per_session(items)
    again = [*items[:2], forwarded(1, "n1", 1, _aggregate(5, (2, 3))), *items[2:]]  # n1's again, after its holdings
    shape = [list(i.step_fold.sessions) if i.WhichOneof("kind") == "step_fold" else i.session
             for i in pack_step_aggregates(again)]
    assert shape == [1, 1, [1, 2, 3, 4], 2, 3, 4], "n1's second aggregate may not move ahead of its holdings"


MESSAGES = st.lists(st.tuples(st.integers(1, 4), st.sampled_from(["agg5", "agg5", "agg6", "xid", "agg5-gen2"])),
                    max_size=30)


@settings(max_examples=150, deadline=None)
@given(MESSAGES)
def test_packing_keeps_every_message_and_each_sessions_order(script):
    items = []
    for session, what in script:
        if what == "xid":
            message = agent_pb2.AgentMessage(xid_event=agent_pb2.XidEvent(code=session))
        else:
            message = _aggregate(6 if what == "agg6" else 5, (2 * session, 2 * session + 1),
                                 generation=2 if what.endswith("gen2") else 1)
        items.append(forwarded(session, f"n{session}", 1, message))
    packed = pack_step_aggregates(items)
    assert _per_session(packed) == _per_session(items)  # every message once, each session's in its order
    assert sorted(map(repr, _expand(packed))) == sorted(map(repr, _expand(items)))
    for item in packed:
        if item.WhichOneof("kind") == "step_fold":
            assert len(set(item.step_fold.sessions)) == len(item.step_fold.sessions) > 1


def test_the_up_queue_packs_step_reports_folded_per_session_only_for_a_leader_that_takes_folds():
    def reports() -> UpQueue:
        queue = UpQueue()
        for session in (1, 2, 3):
            for rank in (2 * session, 2 * session + 1):
                queue.push(forwarded(session, f"n{session}", 1, agent_pb2.AgentMessage(step_report=agent_pb2.StepReport(
                    generation=1, rank=rank, step=4, step_time_s=1.0, compute_time_s=0.5, loss=2.0, param_digest="d"))))
        return queue

    old = reports().take()
    assert [i.message.WhichOneof("kind") for i in old] == ["step_aggregate"] * 3
    queue = reports()
    new = queue.take(packs_steps=True)
    assert len(new) == 1 and list(new[0].step_fold.sessions) == [1, 2, 3] and queue.aggregates_packed == 2
    assert _expand(new) == _expand(old)


# -- the leader decides a packed fold as the per-node messages ---------------------------------------

def _run_wire(script: list[tuple[int, int | None, int | None, int]], packed: bool, faults: bool = True
              ) -> tuple[Sim, list[object], int]:
    """The script's steps as agents' messages: each decoded and decided alone (step_aggregate.to_input,
    one by one), or as the shard's batches bring them packed (each batch's consecutive aggregates
    of one step packed, decoded with step_fold.to_fold and decided as the relay does). Returns the
    sim, each message's answer (its refusal, or True) and how many packed folds the core decided as one."""
    sim = _started()
    now = NOW + 1.0
    answers: list[object] = []
    folds = 0
    sessions = {node: i + 1 for i, node in enumerate([f"n{i}" for i in range(6)] + ["spare", "stranger"])}
    node_of = {session: node for node, session in sessions.items()}
    for step, slow_rank, corrupt_rank, seed in script:
        if sim.state.generation is None:
            break
        rng = random.Random(seed)
        parts = _parts(sim, step, slow_rank, corrupt_rank, rng, faults)
        now += 1.0
        for run in _runs(parts, rng):
            items = [forwarded(sessions[p.node_id], p.node_id, 1, agent_pb2.AgentMessage(step_aggregate=_wire(p)))
                     for p in run]
            for item in pack_step_aggregates(items) if packed else items:
                if item.WhichOneof("kind") == "step_fold":
                    decoded, folded = _decoded([node_of[s] for s in item.step_fold.sessions], item.step_fold)
                    decided = sim.feed_fold(decoded, at=now, folded=folded)
                    if decided is None:
                        decided = [sim.feed(part, at=now) for part in decoded]
                    else:
                        folds += 1
                else:
                    decided = [sim.feed(step_aggregate.to_input(node_of[item.session], item.message.step_aggregate),
                                        at=now)]
                answers.extend(a if isinstance(a, str) else True for a in decided)
    return sim, answers, folds


@settings(max_examples=150, deadline=None)
@given(STEP_SCRIPTS)
def test_packed_folds_decide_what_the_per_node_messages_decide_one_by_one(script):
    (one, one_answers, _), (packed, packed_answers, _) = _run_wire(script, False), _run_wire(script, True)
    assert_same_decisions(one, packed)
    assert packed_answers == one_answers  # the same refusals, word for word, for the same parts


def test_stragglers_and_votes_are_decided_through_packed_folds():
    script = [(s, 3, None, s) for s in range(1, 21)] + [(21, None, 5, 7)]
    (one, _, _), (packed, _, folds) = _run_wire(script, False, False), _run_wire(script, True, False)
    assert_same_decisions(one, packed)
    assert folds >= 10
    assert any(isinstance(e, StragglerDetected) and e.rank == 3 for e in packed.log)
    assert any(isinstance(e, SdcSuspected) and e.rank == 5 for e in packed.log)


async def test_the_relay_decides_a_packed_fold_as_one_and_answers_each_part_on_its_own_route():
    """Four nodes' aggregates of one step packed by their shard (one node's figures out of
    bounds): one fold decided with the decoded fold, the bad node alone hears a refusal; a fold
    naming a session the leader does not know drops that part and folds the rest as usual."""
    runtime = await _registered(4, ranks_per_node=2)
    runtime.metrics = SupervisorMetrics()
    calls: list[bool] = []
    step_aggregates = runtime.core.step_aggregates

    def counted(parts, now, folded=None):  # type: ignore[no-untyped-def]
        calls.append(folded is not None)
        return step_aggregates(parts, now, folded)

    runtime.core.step_aggregates = counted  # type: ignore[method-assign]
    service, down = RelayService(runtime), RelayDown()
    routes = {i: relay_service.RelayRoute(down, session=i) for i in range(4)}
    sessions = {i: _Relayed(runtime.open_stream(routes[i]), f"n{i}", 1, routes[i]) for i in range(4)}
    generation = runtime.state.generation
    assert generation is not None

    def aggregate(node: int, step: int, step_time_s: float = 0.5) -> agent_pb2.StepAggregate:
        member = generation.member(f"n{node}")
        assert member is not None
        return step_pack.pack([agent_pb2.StepReport(generation=1, rank=rank, step=step, step_time_s=step_time_s,
                                                    compute_time_s=0.4, loss=2.0, param_digest="d")
                               for rank in member.ranks])

    first = step_fold_pack.pack([(0, aggregate(0, 1)), (1, aggregate(1, 1)), (2, aggregate(2, 1, -1.0)),
                                 (3, aggregate(3, 1))])
    second = step_fold_pack.pack([(0, aggregate(0, 2)), (9, aggregate(1, 2)), (1, aggregate(1, 2)),
                                  (2, aggregate(2, 2)), (3, aggregate(3, 2))])
    batch = shard_pb2.ShardBatch(items=[shard_pb2.Forwarded(step_fold=first), shard_pb2.Forwarded(step_fold=second)])
    loop = asyncio.create_task(runtime.run())
    try:
        await service._read(_Batches(batch), down, sessions, "shard-a")
        await asyncio.wait_for(_until(lambda: runtime.soft.progress is not None and runtime.soft.progress.max_step == 2
                                      and len(down) >= 1), 5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert calls == [True, False], "the packed fold with its decoded fold; the one missing a session without"
    answers = [(item.session, item.message.WhichOneof("kind")) for item in down.take()]
    assert answers == [(2, "refusal")], answers
    assert runtime.metrics.step_folds._value.get() == 2
    progress = runtime.soft.progress
    assert progress is not None and 1 not in progress.sdc_clear_steps and 2 in progress.sdc_clear_steps


async def test_the_relay_hands_a_usual_packed_fold_to_the_core_whole_with_no_part_made(monkeypatch):
    """A shard's usual fold (every part admitted, no rank reported in the step yet) is decided on
    its arrays (Core.step_fold) with no StepAggregate per part; the step is observed whole."""
    runtime = await _registered(4, ranks_per_node=2)
    whole: list[bool] = []
    step_fold_whole = runtime.core.step_fold

    def spied(fold, now):  # type: ignore[no-untyped-def]
        stepped = step_fold_whole(fold, now)
        whole.append(stepped is not None)
        return stepped

    monkeypatch.setattr(runtime.core, "step_fold", spied)
    made: list[int] = []
    parts = StepAggregate.parts
    monkeypatch.setattr(StepAggregate, "parts", lambda self: made.append(len(self.segments)) or parts(self))
    service, down = RelayService(runtime), RelayDown()
    routes = {i: relay_service.RelayRoute(down, session=i) for i in range(4)}
    sessions = {i: _Relayed(runtime.open_stream(routes[i]), f"n{i}", 1, routes[i]) for i in range(4)}
    generation = runtime.state.generation
    assert generation is not None
    packed = step_fold_pack.pack([(i, step_pack.pack([
        agent_pb2.StepReport(generation=1, rank=rank, step=1, step_time_s=0.5, compute_time_s=0.4, loss=2.0,
                             param_digest="d") for rank in generation.member(f"n{i}").ranks]))  # type: ignore[union-attr]
        for i in range(4)])
    loop = asyncio.create_task(runtime.run())
    try:
        await service._read(_Batches(shard_pb2.ShardBatch(items=[shard_pb2.Forwarded(step_fold=packed)])),
                            down, sessions, "shard-a")
        await asyncio.wait_for(_until(lambda: runtime.soft.progress is not None and runtime.soft.progress.max_step == 1),
                               5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert whole == [True] and made == []
    assert runtime.soft.progress is not None and 1 in runtime.soft.progress.sdc_clear_steps
    assert len(down) == 0, "nothing refused"


def test_the_shard_packs_only_what_the_leader_would_decode():
    def good() -> agent_pb2.StepAggregate:
        return _aggregate(5, (0, 1, 2)).step_aggregate

    assert step_fold_pack.packable(good())
    permuted = good()
    del permuted.param_digests[:]
    permuted.param_digests.add(digest="a", indexes=[2])
    permuted.param_digests.add(digest="b", indexes=[1, 0])
    assert step_fold_pack.packable(permuted)
    broken = []
    for change in ("no ranks", "a loss short", "grad_norm short", "tokens past int64", "a rank in no group",
                   "a rank in two groups", "a grad past the ranks", "a grad twice"):
        message = good()
        if change == "no ranks":
            message = agent_pb2.StepAggregate(generation=1, step=5)
        elif change == "a loss short":
            del message.loss[-1]
        elif change == "grad_norm short":
            message.grad_norm.append(1.0)
        elif change == "tokens past int64":
            message.tokens.extend([0, 0, 2**63])
        elif change == "a rank in no group":
            del message.param_digests[0].indexes[-1]
        elif change == "a rank in two groups":
            message.param_digests.add(digest="x", indexes=[0])
        elif change == "a grad past the ranks":
            message.local_grad_digests.add(digest="g", indexes=[3])
        else:
            message.local_grad_digests.add(digest="g", indexes=[0])
            message.local_grad_digests.add(digest="h", indexes=[0])
        if step_fold_pack.packable(message):
            broken.append(change)
        with pytest.raises(step_aggregate.MalformedAggregate):  # refused with a reason, never an OverflowError
            step_aggregate.to_input("n", message)  # (what the leader does with it alone)
    assert broken == []
