"""Per-step aggregates: the leader decides from a StepAggregate (a node's or a link shard's ranks
of one step in one input) exactly what it decides from the same per-rank StepReports fed one by
one: the same events (straggler verdicts, SDC votes and their convictions, checkpoint starts), the
same state and the same soft state the detectors keep."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings

from ftsup.supervisor.core.events import CheckpointAborted, CheckpointStarted, SdcSuspected, StragglerDetected
from ftsup.supervisor.core.inputs import StepAggregate, StepReport
from tests.support.builders import NOW, Sim
from tests.support.step_scripts import STEP_SCRIPTS, assert_same_decisions, started_job

NODES, RANKS_PER_NODE = 4, 2
WORLD = NODES * RANKS_PER_NODE


def _started() -> Sim:
    return started_job(NODES, RANKS_PER_NODE)


def _reports(sim: Sim, step: int, slow_rank: int | None, corrupt_rank: int | None) -> list[StepReport]:
    generation = sim.state.generation
    assert generation is not None
    reports = []
    for rank in range(WORLD):
        compute = 0.50 + 0.001 * rank + (0.40 if rank == slow_rank else 0.0)
        digest = f"d{step}" + ("x" if rank == corrupt_rank else "")
        reports.append(StepReport(generation.node_of_rank(rank) or "", generation.number, rank, step, compute + 0.1,
                                  compute, 2.0, digest))
    return reports


def _run(script: list[tuple[int, int | None, int | None, int]], aggregated: bool) -> Sim:
    sim = _started()
    now = NOW + 1.0
    for step, slow_rank, corrupt_rank, seed in script:
        if sim.state.generation is None:
            break  # an SDC conviction ended it: both paths stop at the same point
        reports = _reports(sim, step, slow_rank, corrupt_rank)
        rng = random.Random(seed)
        rng.shuffle(reports)  # arrival order, the same for both paths
        for _ in range(seed % 3 if seed % 5 == 0 and seed >= 100 else 0):  # sent again (a reconnect), maybe changed
            first = rng.randrange(len(reports) - 1)  # never the last: it stays the step's last new rank
            original = reports[first]
            slower = rng.choice([1.0, 1.5])
            again = dataclasses.replace(original, compute_time_s=original.compute_time_s * slower,
                                        step_time_s=original.step_time_s * slower,
                                        param_digest=rng.choice([original.param_digest, "resent"]))
            # After the rank's first report and before the step's last new rank: a report after that
            # one, in the same aggregate, is observed before the step is decided where one by one it
            # comes after (as before arrays); open_steps' own tests cover that remainder.
            reports.insert(rng.randrange(first + 1, len(reports)), again)
        now += 1.0
        if not aggregated:
            for report in reports:
                sim.feed(report, at=now)
            continue
        # Split into aggregates at random cut points, each of one node's reports (a node's ranks
        # in one, or in several, as an agent's queue or a shard's fold happens to hold them).
        cuts = sorted(random.Random(seed + 1).sample(range(1, len(reports)), k=seed % 4))
        for start, end in zip([0, *cuts], [*cuts, len(reports)]):
            for run in _runs_of_one_node(reports[start:end]):
                sim.feed(StepAggregate.of_reports(run), at=now)
    return sim


def _runs_of_one_node(reports: list[StepReport]) -> list[list[StepReport]]:
    """Consecutive reports grouped into runs of one node's, each rank once (the arrival order kept)."""
    runs: list[list[StepReport]] = []
    for report in reports:
        if runs and runs[-1][0].node_id == report.node_id and report.rank not in {r.rank for r in runs[-1]}:
            runs[-1].append(report)
        else:
            runs.append([report])
    return runs




@settings(max_examples=150, deadline=None)
@given(STEP_SCRIPTS)
def test_aggregates_decide_what_their_reports_decide_one_by_one(script):
    assert_same_decisions(_run(script, aggregated=False), _run(script, aggregated=True))


def test_a_straggler_and_a_corrupt_rank_are_found_through_aggregates_as_through_reports():
    # Rank 3 slow for 20 steps (the straggler detector needs 11 of 16 over), rank 5's digest
    # differs at step 21 (the vote convicts it): both paths decide the same, and both decide it.
    script = [(s, 3, None, s) for s in range(1, 21)] + [(21, None, 5, 7)]
    one_by_one, aggregated = _run(script, aggregated=False), _run(script, aggregated=True)
    assert_same_decisions(one_by_one, aggregated)
    assert any(isinstance(e, StragglerDetected) and e.rank == 3 for e in aggregated.log)
    assert any(isinstance(e, SdcSuspected) and e.rank == 5 for e in aggregated.log)


def test_an_aggregate_with_a_bad_report_is_refused_whole_naming_the_rank():
    sim = _started()
    reports = _reports(sim, 1, None, None)
    bad = dataclasses.replace(reports[2], compute_time_s=-1.0)
    first, second = (r for r in reports if r.node_id == reports[0].node_id)
    bad = dataclasses.replace(second, compute_time_s=-1.0)
    refused = sim.feed(StepAggregate.of_reports((first, bad)), at=NOW + 1)
    assert isinstance(refused, str) and f"rank {bad.rank}" in refused and "compute_time_s" in refused
    assert sim.soft.progress is None or sim.soft.progress.step_reports == 0, "nothing of it was observed"
    twice = sim.feed(StepAggregate.of_reports((first, first)), at=NOW + 1)
    assert isinstance(twice, str) and "twice" in twice
    foreign = next(r for r in reports if r.node_id != first.node_id)
    stolen = sim.feed(StepAggregate.of_reports((first, dataclasses.replace(foreign, node_id=first.node_id))),
                      at=NOW + 1)
    assert isinstance(stolen, str) and f"does not hold rank {foreign.rank}" in stolen


def test_a_checkpoint_step_that_the_vote_convicts_starts_and_aborts_its_checkpoint_as_one_by_one():
    # Step 3 is a checkpoint step: its first report starts the checkpoint before the last report
    # completes the vote that ends the generation (the checkpoint is then abandoned). Seed 4 sends
    # the whole world as one aggregate, seed 3 as four.
    for seed in (3, 4):
        script = [(1, None, None, 1), (2, None, None, 2), (3, None, 5, seed)]
        one_by_one, aggregated = _run(script, aggregated=False), _run(script, aggregated=True)
        assert_same_decisions(one_by_one, aggregated)
        kinds = [type(e).__name__ for e in aggregated.log]
        assert "CheckpointStarted" in kinds and "SdcSuspected" in kinds
        assert kinds.index("CheckpointStarted") < kinds.index("SdcSuspected")


def test_a_rank_past_the_checkpoint_without_its_shard_aborts_it_where_its_own_report_would():
    """Step 3 starts a checkpoint (every 3 steps); nobody writes a shard, so the first report of
    step 4 aborts it, naming its rank, the same through aggregates (the middle of one included) as
    one by one; step 6 then starts the next attempt instead of waiting out the first's timeout."""
    script = [(1, None, None, 0), (2, None, None, 0), (3, None, None, 7), (4, None, None, 11),
              (5, None, None, 0), (6, None, None, 0)]
    one_by_one, aggregated = _run(script, aggregated=False), _run(script, aggregated=True)
    assert_same_decisions(one_by_one, aggregated)
    aborts = [e for e in one_by_one.log if isinstance(e, CheckpointAborted)]
    assert len(aborts) == 1 and "reported step 4 without writing its shard of step 3" in aborts[0].reason
    started = [e.step for e in one_by_one.log if isinstance(e, CheckpointStarted)]
    assert started == [3, 6]
