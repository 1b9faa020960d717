"""Folds: several nodes' step aggregates decided as one input (Core.step_aggregates, issue 14)
decide exactly what the same aggregates decide one by one: the same events in the same order,
the same refusals for the same parts, the same state and the same soft state the detectors keep.
A fold the core cannot decide as one (a rank already reported in the step) is declined whole,
with nothing observed, and the caller steps each part."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings

from ftsup.supervisor.core import admission, open_steps
from ftsup.supervisor.core.events import CheckpointStarted, SdcSuspected, StragglerDetected
from ftsup.supervisor.core.inputs import StepAggregate, StepReport
from tests.support.builders import NOW, Sim
from tests.support.step_scripts import STEP_SCRIPTS, assert_same_decisions, started_job

NODES, RANKS_PER_NODE = 6, 2
WORLD = NODES * RANKS_PER_NODE


def _started() -> Sim:
    return started_job(NODES, RANKS_PER_NODE, spare=True)


def _parts(sim: Sim, step: int, slow_rank: int | None, corrupt_rank: int | None, rng: random.Random,
           faults: bool = True) -> list[StepAggregate]:
    """Each node's ranks of `step` as one aggregate, nodes in a random order; now and then a part
    that admission refuses (a bad figure, a stale generation, ranks the sender does not hold,
    a node that never said Hello) or a node's part sent again."""
    generation = sim.state.generation
    assert generation is not None
    by_node: dict[str, list[StepReport]] = {}
    for rank in range(WORLD):
        compute = 0.50 + 0.001 * rank + (0.40 if rank == slow_rank else 0.0)
        digest = f"d{step}" + ("x" if rank == corrupt_rank else "")
        node = generation.node_of_rank(rank) or ""
        by_node.setdefault(node, []).append(StepReport(node, generation.number, rank, step, compute + 0.1, compute,
                                                       2.0 - 0.01 * rank, digest, tokens=100 + rank))
    parts = [StepAggregate.of_reports(reports) for reports in by_node.values()]
    rng.shuffle(parts)
    kind = rng.randrange(12) if faults else -1
    if kind == 0:  # a bad figure: that part alone is refused
        at = rng.randrange(len(parts))
        reports = [dataclasses.replace(r, compute_time_s=-1.0) for r in parts[at].reports()]
        parts[at] = StepAggregate.of_reports(reports)
    elif kind == 1:  # a stale generation
        at = rng.randrange(len(parts))
        parts[at] = StepAggregate.of_reports([dataclasses.replace(r, generation=r.generation - 1)
                                              for r in parts[at].reports()])
    elif kind == 2:  # the spare claims a member's ranks (it holds none)
        parts.insert(rng.randrange(len(parts) + 1), StepAggregate.of_reports(
            [dataclasses.replace(r, node_id="spare") for r in parts[0].reports()]))
    elif kind == 3:  # a node that never said Hello
        parts.insert(rng.randrange(len(parts) + 1), StepAggregate.of_reports(
            [dataclasses.replace(r, node_id="stranger") for r in parts[0].reports()]))
    elif kind == 4:  # a node's part sent again (a reconnect), later in the step, maybe changed
        at = rng.randrange(len(parts) - 1)
        again = [dataclasses.replace(r, param_digest=rng.choice([r.param_digest, "resent"]))
                 for r in parts[at].reports()]
        parts.insert(rng.randrange(at + 1, len(parts)), StepAggregate.of_reports(again))
    elif kind == 5:  # a generation's tail: every node's step of the one before, one with a bad figure too
        parts = [StepAggregate.of_reports([dataclasses.replace(r, generation=r.generation - 1) for r in part.reports()])
                 for part in parts]
        at = rng.randrange(len(parts))
        parts[at] = StepAggregate.of_reports([dataclasses.replace(r, step_time_s=-2.0) for r in parts[at].reports()])
    return parts


def _runs(parts: list[StepAggregate], rng: random.Random) -> list[list[StepAggregate]]:
    """The parts cut at random into runs, as a shard's batches happen to bring them."""
    cuts = sorted(rng.sample(range(1, len(parts)), k=rng.randrange(min(3, len(parts)))))
    return [parts[a:b] for a, b in zip([0, *cuts], [*cuts, len(parts)])]


def _foldable(run: list[StepAggregate]) -> bool:
    """A run a shard would pack as one ShardStepFold: one generation's step, each node once."""
    first = run[0]
    return (len(run) > 1 and all((p.generation, p.step) == (first.generation, first.step) for p in run)
            and len({p.node_id for p in run}) == len(run))


def _run(script: list[tuple[int, int | None, int | None, int]], folded: bool, faults: bool = True,
         whole: bool = False) -> tuple[Sim, list[object], int]:
    """The script's steps fed one aggregate at a time, or in folds (`whole`: a foldable run as a
    shard's packed fold, decided on its arrays when it may be); returns the sim, every part's
    answer (its refusal, or True: admitted) and how many runs were decided as one fold."""
    sim = _started()
    now = NOW + 1.0
    answers: list[object] = []
    folds = 0
    for step, slow_rank, corrupt_rank, seed in script:
        if sim.state.generation is None:
            break  # an SDC conviction ended it: both paths stop at the same point
        rng = random.Random(seed)
        parts = _parts(sim, step, slow_rank, corrupt_rank, rng, faults)
        now += 1.0
        for run in _runs(parts, rng):
            if whole and _foldable(run):
                decided = sim.feed_step_fold(run, at=now)
            else:
                decided = sim.feed_fold(run, at=now) if folded else None
            if decided is None:
                decided = [sim.feed(part, at=now) for part in run]
            else:
                folds += 1
            answers.extend(a if isinstance(a, str) else True for a in decided)
    return sim, answers, folds




@settings(max_examples=150, deadline=None)
@given(STEP_SCRIPTS)
def test_a_fold_decides_what_its_aggregates_decide_one_by_one(script):
    (one, one_answers, _), (folded, folded_answers, _) = _run(script, folded=False), _run(script, folded=True)
    assert_same_decisions(one, folded)
    assert folded_answers == one_answers  # the same refusals, word for word, for the same parts
    whole, whole_answers, _ = _run(script, folded=True, whole=True)  # (a shard's packed folds, on their arrays)
    assert_same_decisions(one, whole)
    assert whole_answers == one_answers
    with pytest.MonkeyPatch.context() as patch:  # (a fold's ranks taken by arrays, as a real fold's many are)
        patch.setattr(open_steps, "_FEW_RANKS", 1)
        arrays, arrays_answers, _ = _run(script, folded=True, whole=True)
    assert_same_decisions(one, arrays)
    assert arrays_answers == one_answers


def _started_counting_parts(monkeypatch: pytest.MonkeyPatch) -> tuple[Sim, list[StepAggregate], list[int]]:
    """A started job, its nodes' aggregates of step 1, and the sizes of the folds made into parts
    (StepAggregate.parts: a fold not decided whole), as they are made."""
    sim = _started()
    parts = _parts(sim, 1, None, None, random.Random(0), faults=False)[:NODES]
    made: list[int] = []
    real = StepAggregate.parts
    monkeypatch.setattr(StepAggregate, "parts", lambda self: made.append(len(self.segments)) or real(self))
    return sim, parts, made


def test_a_usual_fold_is_decided_whole_on_its_arrays_and_a_fold_with_a_bad_part_is_not(monkeypatch):
    sim, parts, made = _started_counting_parts(monkeypatch)
    answers = sim.feed_step_fold(parts[:3], at=NOW + 1)
    assert answers is not None and all(isinstance(a, list) for a in answers) and made == []
    foreign = StepAggregate.of_reports([dataclasses.replace(r, node_id=parts[4].node_id) for r in parts[3].reports()])
    answers = sim.feed_step_fold([foreign, parts[5]], at=NOW + 1)  # (a rank its sender does not hold)
    assert made == [2] and answers is not None
    assert isinstance(answers[0], str) and "does not hold rank" in answers[0] and isinstance(answers[1], list)
    twice = StepAggregate.of_reports([parts[3].reports()[0]] * 2)  # (its node's rank, twice)
    answers = sim.feed_step_fold([twice, parts[4]], at=NOW + 1)
    assert made == [2, 2] and answers is not None
    assert isinstance(answers[0], str) and "reported twice" in answers[0]


def test_a_fold_naming_a_member_this_leader_has_not_heard_say_hello_is_not_decided_whole(monkeypatch):
    # A new leader knows the generation's members from the log before their Hellos come again: a
    # shard's fold naming one of them must not be admitted whole (its slots alone would pass).
    sim, parts, made = _started_counting_parts(monkeypatch)
    del sim.soft.nodes[parts[1].node_id]
    answers = sim.feed_step_fold(parts[:2], at=NOW + 1)
    assert made == [2] and answers is not None
    assert isinstance(answers[1], str) and "has not said Hello" in answers[1]


def test_stragglers_votes_and_checkpoints_are_decided_through_folds():
    # Rank 3 slow for 20 steps, rank 5's digest differs at step 21; checkpoints every 3 steps. The
    # folds must actually be taken (not declined into the one-by-one path) for this to test them.
    script = [(s, 3, None, s) for s in range(1, 21)] + [(21, None, 5, 7)]
    (one, _, _), (folded, _, folds) = _run(script, False, faults=False), _run(script, True, faults=False)
    assert_same_decisions(one, folded)
    assert folds >= 15
    assert any(isinstance(e, StragglerDetected) and e.rank == 3 for e in folded.log)
    assert any(isinstance(e, SdcSuspected) and e.rank == 5 for e in folded.log)
    assert any(isinstance(e, CheckpointStarted) for e in folded.log)


def test_a_fold_with_a_rank_already_reported_in_its_step_is_declined_and_changes_nothing():
    sim = _started()
    generation = sim.state.generation
    assert generation is not None
    parts = _parts(sim, 1, None, None, random.Random(0))
    while len(parts) > NODES:  # (the plain step: each node once)
        parts.pop()
    sim.events(parts[0], at=NOW + 1)
    before = (sim.soft.progress.step_reports if sim.soft.progress else 0, dict(sim.soft.progress.open_times))
    assert sim.feed_fold([parts[0], parts[1]], at=NOW + 1) is None  # parts[0]'s ranks were reported
    assert before == (sim.soft.progress.step_reports, dict(sim.soft.progress.open_times))
    assert sim.feed_fold(parts[1:], at=NOW + 1) is not None  # the rest complete the step
    assert sim.soft.progress.max_step == 1 and 1 in sim.soft.progress.sdc_clear_steps


def test_a_part_admission_refuses_is_refused_alone_and_the_rest_are_decided():
    sim = _started()
    parts = _parts(sim, 1, None, None, random.Random(0))[:NODES]
    bad = StepAggregate.of_reports([dataclasses.replace(r, compute_time_s=-1.0) for r in parts[2].reports()])
    answers = sim.feed_fold([*parts[:2], bad, *parts[3:]], at=NOW + 1)
    assert answers is not None
    assert isinstance(answers[2], str) and "compute_time_s" in answers[2]
    assert all(isinstance(a, list) for i, a in enumerate(answers) if i != 2)
    assert sim.soft.progress is not None and sim.soft.progress.step_reports == WORLD - RANKS_PER_NODE


def test_a_fold_of_an_ended_generation_is_refused_part_by_part_with_one_check_each(monkeypatch):
    # A failure's tail: every node's last step arrives after its generation ended. Each part is
    # refused with its own words (a bad figure before the stale generation), and admission runs
    # once per part: the fold's refusals are not checked again one by one.
    sim = _started()
    parts = _parts(sim, 1, None, None, random.Random(0))[:NODES]
    stale = [StepAggregate.of_reports([dataclasses.replace(r, generation=r.generation + 1) for r in p.reports()])
             for p in parts]
    stale[1] = StepAggregate.of_reports([dataclasses.replace(r, step_time_s=-2.0) for r in stale[1].reports()])
    checks = []
    real = admission.refusal
    monkeypatch.setattr(admission, "refusal", lambda *a, **k: checks.append(a[2]) or real(*a, **k))
    answers = sim.feed_fold(stale, at=NOW + 1)
    assert answers is not None and len(answers) == len(stale)
    assert "step_time_s=-2.0" in answers[1]
    ranks = [int(p.ranks[0]) for p in stale]
    assert all(f"rank {ranks[i]} of node {stale[i].node_id!r}: stale generation 2 (the generation in force is 1)"
               == answers[i] for i in range(len(stale)) if i != 1)
    assert len(checks) == len(stale)
    assert sim.soft.progress is None or sim.soft.progress.step_reports == 0


def test_a_fold_keeps_each_position_s_node_rank_and_figures():
    sim = _started()
    parts = _parts(sim, 1, None, None, random.Random(3))[:NODES]
    fold = StepAggregate.fold(parts)
    assert fold.node_ids() == tuple(p.node_id for p in parts)
    assert fold.reports() == tuple(r for p in parts for r in p.reports())
    assert np.array_equal(fold.ranks, np.concatenate([p.ranks for p in parts])) and not fold.ranks.flags.writeable
    for bad in ([], [parts[0], parts[0]], [parts[0], dataclasses.replace(parts[1], step=2)], [fold, parts[0]]):
        with pytest.raises(ValueError):
            StepAggregate.fold(bad)
    refused = sim.feed(fold, at=NOW + 1)  # a fold is the core's own form, never an input
    assert isinstance(refused, str) and "not an input" in refused
