"""Snapshot holdings: the leader decides from a SnapshotHoldings (a node's snapshot reports of one
step in one input) exactly what it decides from the same SnapshotReports fed one by one: the same
commits (SnapshotCommitted, and a pending drain's hand-over at the committed step), the same state
and the same soft state; and a message with any entry the sender may not hold is refused whole.

One difference, on the safe side: a holder that contradicts its own earlier holding of a rank (other
bytes) in the same message after the entry that completed the step blocks that commit, where one by
one the commit came first (the last test). The property's generator never has a holder change its
bytes, so it holds exactly.

Several nodes' SnapshotHoldings of one step, back to back in a shard's batch, are decided as one
(Core.step_holdings, what the runtime does with a run of them): the same log, state, soft state and
refusals as each fed alone, with no exception (the fold ends at the part after which the step
commits)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core import holder_slots, step_holdings
from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core.events import NodeDrained, RankAssignment, SnapshotCommitted
from ftsup.supervisor.core.inputs import (
    HoldingsFold,
    OperatorCommandKind,
    OperatorRequest,
    SnapshotHoldings,
    SnapshotReport,
    StepReport,
    Tick,
)
from ftsup.supervisor.core.soft import is_held_twice
from ftsup.supervisor.core.step_holdings import StepHoldings
from tests.support.builders import NOW, Sim, config, hello

NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE


def _started() -> Sim:
    sim = Sim(config(nodes=NODES, ranks_per_node=RANKS_PER_NODE))
    for i in range(NODES):
        sim.events(hello(f"n{i}", stream_id=i + 1), at=NOW)
    sim.events(Tick(), at=NOW + 0.1)
    assert sim.state.generation is not None
    return sim


def _holders(sim: Sim, rank: int) -> tuple[str, str]:
    generation = sim.state.generation
    assert generation is not None
    owner = generation.node_of_rank(rank) or ""
    member = generation.member(owner)
    assert member is not None
    return owner, member.buddy_node_id


def _step_reports(sim: Sim, step: int) -> list[StepReport]:
    generation = sim.state.generation
    assert generation is not None
    return [StepReport(generation.node_of_rank(r) or "", generation.number, r, step, 0.6, 0.5, 2.0, f"d{step}")
            for r in range(WORLD)]


def _messages(sim: Sim, step: int, rng: random.Random) -> list[list[SnapshotReport]]:
    """One step's holdings as the nodes send them: each holder's reports of the ranks it holds
    (some missing, some buddy copies with other bytes), cut into one to three messages per node,
    some nodes' all again in one more (as after a reconnect), the nodes' messages interleaved."""
    generation = sim.state.generation
    assert generation is not None
    by_node: dict[str, list[SnapshotReport]] = {}
    for rank in range(WORLD):
        owner, buddy = _holders(sim, rank)
        for holder in (owner, buddy):
            if rng.random() < 0.03:
                continue  # this copy is not (yet) held
            sha = f"s{step}.{rank}" + ("x" if holder == buddy and rng.random() < 0.05 else "")
            by_node.setdefault(holder, []).append(SnapshotReport(holder, generation.number, rank, step, (holder,),
                                                                 100 + rank, sha))
    messages: list[list[SnapshotReport]] = []
    for reports in by_node.values():
        rng.shuffle(reports)
        cuts = sorted(rng.sample(range(1, len(reports)), k=min(rng.randint(0, 2), len(reports) - 1)))
        for start, end in zip([0, *cuts], [*cuts, len(reports)]):
            messages.append(reports[start:end])
        if rng.random() < 0.3:  # all of them again, as a reconnect's resync sends what it holds
            messages.append(rng.sample(reports, len(reports)))
    rng.shuffle(messages)
    return [m for m in messages if m]


def _run(script: list[tuple[int, int, int | None]], aggregated: bool, folded: bool = False,
         strays: bool = False) -> Sim:
    """`aggregated`: each message as one SnapshotHoldings, else its reports one by one; `folded`
    (with `aggregated`): back-to-back holdings of one step from distinct nodes decided as one, cut
    into runs at random as a shard's batches happen to; `strays`: now and then a message the
    leader refuses whole (a rank its sender may not hold, a node that never said Hello)."""
    sim = _started()
    now = NOW + 1.0
    late: list[list[SnapshotReport]] = []
    for step, seed, drain in script:
        if sim.state.generation is None:
            break  # a drain's hand-over ended it: both paths stop at the same point
        rng = random.Random(seed)
        now += 1.0
        votes_first = rng.random() < 0.7  # else the step's vote completes after its holdings came
        for report in _step_reports(sim, step) if votes_first else ():
            sim.feed(report, at=now)
        if drain is not None:
            sim.feed(OperatorRequest(OperatorCommandKind.DRAIN, f"n{drain}", "maintenance", "op"), at=now)
        messages = _messages(sim, step, rng)
        if rng.random() < 0.3:  # some holdings of this step arrive after the next step's
            late, messages = messages[-1:], [*late, *messages[:-1]]
        else:
            messages, late = [*late, *messages], []
        if strays:
            messages = _with_strays(sim, messages, rng)
        if folded:
            _feed_folded(sim, messages, rng, now)
        for message in () if folded else messages:
            if not aggregated:
                for report in message:
                    sim.feed(report, at=now)
            else:
                sim.feed(SnapshotHoldings.of_reports(message), at=now)
        if votes_first or sim.state.generation is None:
            continue  # (a drain's hand-over at a commit ended the generation)
        for report in _step_reports(sim, step):
            sim.feed(report, at=now)
    return sim


def _with_strays(sim: Sim, messages: list[list[SnapshotReport]], rng: random.Random) -> list[list[SnapshotReport]]:
    out = list(messages)
    for _ in range(rng.randrange(3)):
        model = rng.choice(messages)[0]
        if rng.random() < 0.5:
            foreign = next(r for r in range(WORLD) if model.node_id not in _holders(sim, r))
            stray = [dataclasses.replace(model, rank=foreign)]
        else:
            stray = [dataclasses.replace(model, node_id="stranger")]
        out.insert(rng.randrange(len(out) + 1), stray)
    return out


def _feed_folded(sim: Sim, messages: list[list[SnapshotReport]], rng: random.Random, now: float) -> None:
    """The messages as the runtime meets them in a shard's runs: back-to-back holdings of one step
    from distinct nodes decided as one fold (Sim.feed_holdings), anything else alone."""
    holdings = [SnapshotHoldings.of_reports(m) for m in messages]
    run: list[SnapshotHoldings] = []

    def close() -> None:
        if len(run) < 2 or sim.feed_holdings(run, at=now) is None:
            for part in run:
                sim.feed(part, at=now)
        run.clear()

    for part in holdings:
        if run and ((part.generation, part.step) != (run[0].generation, run[0].step)
                    or part.node_id in {p.node_id for p in run} or rng.random() < 0.15):
            close()
        run.append(part)
    close()


steps = st.lists(
    st.tuples(st.integers(0, 10_000), st.sampled_from([None] * 12 + [1])),
    min_size=1, max_size=12,
).map(lambda rows: [(i + 1, seed, drain) for i, (seed, drain) in enumerate(rows)])


def _same(one_by_one: Sim, aggregated: Sim) -> None:
    assert aggregated.log == one_by_one.log
    assert aggregated.state == one_by_one.state
    assert aggregated.soft == one_by_one.soft


@settings(max_examples=150, deadline=None)
@given(steps)
def test_holdings_decide_what_their_reports_decide_one_by_one(script):
    _same(_run(script, aggregated=False), _run(script, aggregated=True))


@settings(max_examples=150, deadline=None)
@given(steps)
def test_several_nodes_holdings_decided_as_one_decide_what_they_decide_one_by_one(script):
    _same(_run(script, aggregated=True, strays=True), _run(script, aggregated=True, folded=True, strays=True))


@settings(max_examples=60, deadline=None)
@given(steps)
def test_with_room_for_few_steps_folds_still_decide_what_they_decide_one_by_one(script):
    # Steps' holdings past MAX_HOLDING_STEPS push out the farthest from the newest report; with a
    # bound this small the scripts' late and reordered steps do, in both paths alike.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(soft_state, "MAX_HOLDING_STEPS", 2)
        _same(_run(script, aggregated=True, strays=True), _run(script, aggregated=True, folded=True, strays=True))


def test_a_fold_of_holdings_ends_at_the_part_that_commits_and_the_rest_come_after_the_commit():
    sim = _started()
    for report in _step_reports(sim, 1):
        sim.feed(report, at=NOW + 1)
    parts = [_full_holdings(sim, f"n{i}", 1) for i in range(NODES)]
    stray = dataclasses.replace(parts[0], node_id="stranger")
    answers = sim.feed_holdings([stray, *parts, _full_holdings(sim, "n0", 2)], at=NOW + 1)
    assert answers is None, "holdings of two steps are not one fold"
    answers = sim.feed_holdings([stray, *parts], at=NOW + 1)
    assert answers is not None
    assert isinstance(answers[0], str) and "has not said Hello" in answers[0]
    assert answers[-1] == [SnapshotCommitted(1, 1)], "the last node's holdings complete the step"
    assert all(a == answers[-1] for a in answers[1:]), "every admitted part answers the fold's decision"
    assert [e for e in sim.log if isinstance(e, SnapshotCommitted)] == [SnapshotCommitted(1, 1)]
    again = sim.feed_holdings([_full_holdings(sim, "n1", 1), _full_holdings(sim, "n2", 1)], at=NOW + 1)
    assert again == [[], []], "after the commit its step's holdings decide nothing"
    assert sim.soft.progress is not None and not sim.soft.progress.holdings


def test_a_holder_contradicting_itself_after_the_commit_in_the_same_fold_leaves_the_commit_as_one_by_one():
    # n0's holdings of rank 6 complete step 1; n1, later in the same fold, names other bytes for a
    # rank it held. One by one the step commits first; so it does in the fold, which ends there.
    def run(folded: bool) -> Sim:
        sim, held = _held_but_rank_6()
        n1 = _full_holdings(sim, "n1", 1)
        parts = [SnapshotHoldings.of_reports([held[6]]),
                 SnapshotHoldings.of_reports([dataclasses.replace(n1.reports()[0], sha256="other")])]
        if folded:
            assert sim.feed_holdings(parts, at=NOW + 1) is not None
        for part in () if folded else parts:
            sim.feed(part, at=NOW + 1)
        return sim

    one_by_one, folded = run(False), run(True)
    _same(one_by_one, folded)
    assert [e for e in folded.log if isinstance(e, SnapshotCommitted)] == [SnapshotCommitted(1, 1)]


def test_steps_commit_and_a_drain_hands_over_through_holdings_as_through_reports():
    # Seeds picked so that steps 1 and 3 are held twice; node n1's drain waits for step 3's commit.
    script = [(1, 0, None), (2, 1000, None), (3, 2000, 1)]
    one_by_one, aggregated = _run(script, aggregated=False), _run(script, aggregated=True)
    _same(one_by_one, aggregated)
    commits = [e.step for e in aggregated.log if isinstance(e, SnapshotCommitted)]
    assert commits == [1, 3]
    assert any(isinstance(e, NodeDrained) and e.node_id == "n1" for e in aggregated.log)


def _full_holdings(sim: Sim, node: str, step: int) -> SnapshotHoldings:
    generation = sim.state.generation
    assert generation is not None
    reports = tuple(SnapshotReport(node, generation.number, rank, step, (node,), 10, f"s{rank}")
                    for rank in range(WORLD) if node in _holders(sim, rank))
    return SnapshotHoldings.of_reports(reports)


def _held_but_rank_6() -> tuple[Sim, dict[int, SnapshotReport]]:
    """Step 1 voted, and every copy of it held but n0's of rank 6 (n3's rank, n0 its buddy):
    n1-n3 sent all theirs, n0 its ranks 0, 1 and 7. Returns the sim and n0's holdings by rank."""
    sim = _started()
    for report in _step_reports(sim, 1):
        sim.feed(report, at=NOW + 1)
    for node in ("n1", "n2", "n3"):
        sim.events(_full_holdings(sim, node, 1), at=NOW + 1)
    held = {r.rank: r for r in _full_holdings(sim, "n0", 1).reports()}
    sim.events(SnapshotHoldings.of_reports([held[0], held[1], held[7]]), at=NOW + 1)
    return sim, held


def test_holdings_with_a_rank_the_sender_may_not_hold_are_refused_whole_naming_it():
    sim = _started()
    good = _full_holdings(sim, "n0", 1)
    foreign = next(r for r in range(WORLD) if "n0" not in _holders(sim, r))
    bad = dataclasses.replace(good.reports()[0], rank=foreign)
    refused = sim.feed(SnapshotHoldings.of_reports([*good.reports(), bad]), at=NOW + 1)
    assert isinstance(refused, str) and f"rank {foreign}:" in refused and "neither the owner nor the buddy" in refused
    assert sim.soft.progress is None or not sim.soft.progress.holdings, "nothing of it was held"
    assert sim.feed(good, at=NOW + 1) == []  # the same holdings without the bad entry are taken


def test_malformed_holdings_are_refused_with_the_reason():
    sim = _started()
    good = _full_holdings(sim, "n0", 1)
    twice = sim.feed(dataclasses.replace(good, ranks=(good.ranks[0], good.ranks[0]), size_bytes=(10, 10),
                                         sha256=(good.sha256[0], good.sha256[0])), at=NOW + 1)
    assert isinstance(twice, str) and "held twice" in twice
    short = sim.feed(dataclasses.replace(good, sha256=good.sha256[:1]), at=NOW + 1)
    assert isinstance(short, str) and f"sha256 has 1 values for {len(good.ranks)} ranks" in short
    empty = sim.feed(dataclasses.replace(good, ranks=(), size_bytes=(), sha256=()), at=NOW + 1)
    assert isinstance(empty, str) and "no ranks" in empty
    stale = sim.feed(dataclasses.replace(good, generation=99), at=NOW + 1)
    assert isinstance(stale, str) and "stale generation 99" in stale
    unknown = sim.feed(dataclasses.replace(good, node_id="ghost"))
    assert isinstance(unknown, str) and "has not said Hello" in unknown
    assert sim.soft.progress is None or not sim.soft.progress.holdings, "nothing of them was held"


def test_holdings_hold_one_nodes_reports_of_one_step():
    # The core's holdings name their holder, generation and step once: reports of another node or
    # step cannot be put in them (the wire's form cannot say so either).
    sim = _started()
    reports = _full_holdings(sim, "n0", 1).reports()
    for odd in (dataclasses.replace(reports[1], step=2), dataclasses.replace(reports[1], node_id="n1"),
                dataclasses.replace(reports[1], generation=2)):
        with pytest.raises(ValueError, match="one node's reports of one generation's step"):
            SnapshotHoldings.of_reports([reports[0], odd])
    with pytest.raises(ValueError, match="at least one"):
        SnapshotHoldings.of_reports([])


def test_entries_after_the_one_that_completes_a_step_leave_what_they_leave_one_by_one():
    # n0 holds ranks 0, 1 (its own) and 6, 7 (n3's copies). Every other copy of step 1 is held and
    # the step's vote agreed; n0's second message holds rank 6 (completing the step) and then
    # ranks 7 and 0 again (a resync): one by one the step commits at rank 6 and the later entries
    # are not held (the step is committed); as one message, held and then forgotten at the commit.
    def run(aggregated: bool) -> Sim:
        sim, held = _held_but_rank_6()
        last = (held[6], held[7], held[0])
        if aggregated:
            sim.events(SnapshotHoldings.of_reports(last), at=NOW + 1)
        for report in () if aggregated else last:
            sim.events(report, at=NOW + 1)
        return sim

    one_by_one, aggregated = run(False), run(True)
    _same(one_by_one, aggregated)
    assert [e for e in aggregated.log if isinstance(e, SnapshotCommitted)] == [SnapshotCommitted(1, 1)]
    assert aggregated.soft.progress is not None and not aggregated.soft.progress.holdings


def test_a_holder_contradicting_itself_after_the_step_was_complete_blocks_the_commit_as_one_message():
    # The one difference from one by one, and the safe side of it: n0 names other bytes for rank
    # 0 than it held before, after the entry that completed the step. One by one the step commits
    # first and the contradiction comes too late to matter; as one message it is seen before the
    # decision and the step never commits (a holder whose bytes changed is no restore source).
    sim, held = _held_but_rank_6()
    changed = dataclasses.replace(held[0], sha256="other")
    assert sim.events(SnapshotHoldings.of_reports([held[6], changed]), at=NOW + 1) == []
    assert sim.soft.progress is not None and 1 in sim.soft.progress.holding_mismatches


def test_an_overlong_digest_is_refused_alone_and_inside_holdings_naming_the_rank():
    sim = _started()
    good = _full_holdings(sim, "n0", 1)
    long = dataclasses.replace(good.reports()[1], sha256="a" * 129)
    alone = sim.feed(long, at=NOW + 1)
    assert isinstance(alone, str) and "sha256 of 129 characters is longer than 128" in alone
    inside = sim.feed(SnapshotHoldings.of_reports([good.reports()[0], long]), at=NOW + 1)
    assert isinstance(inside, str) and f"rank {long.rank}: sha256 of 129 characters" in inside


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, WORLD - 1), st.sampled_from([0, 1])), max_size=3 * WORLD))
def test_counting_held_pairs_answers_the_commit_check_as_the_full_pass_does(held):
    # A step's holdings (a StepHoldings) answer "not held twice" from their pair count while
    # pairs are missing; the answer must be the full pass's over the same holdings, whatever came
    # in what order and however often. (No vote is fed, so nothing commits and forgets them.)
    sim = _started()
    generation = sim.state.generation
    assert generation is not None
    for rank, which in held:
        node = _holders(sim, rank)[which]
        sim.events(SnapshotReport(node, generation.number, rank, 1, (node,), 10, f"s{rank}"), at=NOW + 1)
        assert sim.soft.progress is not None
        step = sim.soft.progress.holdings[1]
        assert isinstance(step, StepHoldings)
        assert is_held_twice(step, generation.index) == is_held_twice(dict(step), generation.index)
    every = [(rank, which) for rank in range(WORLD) for which in (0, 1)]
    for rank, which in every:  # and once every pair came, both say held twice
        node = _holders(sim, rank)[which]
        sim.events(SnapshotReport(node, generation.number, rank, 1, (node,), 10, f"s{rank}"), at=NOW + 1)
    assert sim.soft.progress is not None
    step = sim.soft.progress.holdings[1]
    assert isinstance(step, StepHoldings) and step.pairs == 2 * WORLD
    assert is_held_twice(step, generation.index) and is_held_twice(dict(step), generation.index)


def test_folds_that_complete_no_step_are_held_as_one_and_leave_what_one_by_one_leaves(monkeypatch):
    # A fold none of whose parts can complete its step is held with one set of array operations
    # (soft.hold_fold); one that may is held part by part, so the commit lands at its part. Both
    # must leave the log, the state and the soft state (holders and first digests) of one by one.
    answers: list[bool] = []
    hold_fold = soft_state.hold_fold

    def spied(*args: Any) -> bool:
        answers.append(hold_fold(*args))
        return answers[-1]

    monkeypatch.setattr(soft_state, "hold_fold", spied)
    script = [(1, 0, None), (2, 1000, None), (3, 2000, None), (4, 7, None)]
    one_by_one, folded = _run(script, aggregated=True), _run(script, aggregated=True, folded=True)
    _same(one_by_one, folded)
    assert answers.count(True) >= 10, "most folds are held as one"
    assert False in answers, "the fold that may complete a step goes part by part"
    assert [e.step for e in folded.log if isinstance(e, SnapshotCommitted)], "steps commit through both"
    progress = folded.soft.progress
    assert progress is not None and progress.holding_mismatches, "a buddy's other bytes were seen in a fold"


def test_a_fold_naming_a_rank_twice_for_one_holder_is_not_located_but_its_owner_and_buddy_are():
    # a owns ranks 0-1 and backs b up; b owns 2-3 and backs a up. Each may report a rank once, as
    # its owner or its buddy; the owner and the buddy of one rank are two pairs, not a repeat.
    slots = holder_slots.build([RankAssignment("a", (0, 1), "b"), RankAssignment("b", (2, 3), "a")], None, exact=True)

    def fold(counts: list[int], ranks: list[int]) -> HoldingsFold:
        return HoldingsFold(("a", "b"), 1, 5, tuple(counts), np.array(ranks, dtype=np.int64),
                            np.ones(len(ranks), dtype=np.int64), tuple("0" * 64 for _ in ranks))

    assert step_holdings.locate(slots, fold([4, 4], [0, 1, 2, 3, 2, 3, 0, 1])) is not None
    assert step_holdings.locate(slots, fold([3, 1], [0, 1, 0, 2])) is None, "a names its own rank 0 twice"
    assert step_holdings.locate(slots, fold([3, 1], [2, 0, 2, 2])) is None, "a names b's rank 2 twice"
    assert step_holdings.locate(slots, fold([1, 1], [5, 2])) is None, "a rank past the generation's"


def test_a_holdings_fold_naming_a_member_this_leader_has_not_heard_say_hello_is_not_decided_whole():
    # A new leader knows the members from the log before their Hellos come again: the fold's slots
    # alone would place its entries; its sender's Hello must be asked of each part.
    sim = _started()
    generation = sim.state.generation
    assert generation is not None
    parts = []
    for node in ("n0", "n1"):
        ranks = sorted(r for r in range(WORLD) if _holders(sim, r)[0] == node)
        parts.append(SnapshotHoldings(node, generation.number, 1, tuple(ranks), (1,) * len(ranks),
                                      tuple(f"s{r}" for r in ranks)))
    fold = HoldingsFold.of_parts(parts)
    assert sim.core.step_holdings_fold(fold, NOW + 1) is not None, "both said Hello: decided whole"
    sim = _started()
    del sim.soft.nodes["n1"]
    assert sim.core.step_holdings_fold(fold, NOW + 1) is None
