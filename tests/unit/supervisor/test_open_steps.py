"""Open steps: a step's compute times and digests kept until every rank is in, O(1) per aggregate
while no rank repeats, per-rank arrays (last report wins) once one does, and the rest of an
aggregate that completed its step partway handed to a fresh track, as the per-rank dicts did."""

from __future__ import annotations

import numpy as np

from ftsup.supervisor.core import open_steps
from ftsup.supervisor.core.inputs import StepAggregate, StepReport


def agg(node: str, *rows: tuple[int, float, str]) -> StepAggregate:
    return StepAggregate.of_reports([StepReport(node, 1, rank, 5, 1.0, compute, 2.0, digest)
                                     for rank, compute, digest in rows])


def test_a_step_completes_when_every_rank_is_in_and_keeps_arrival_order():
    times: dict[int, open_steps.OpenTimes] = {}
    assert open_steps.add_times(times, 5, 4, agg("b", (2, 0.3, "d"), (3, 0.4, "d")), 0) == (2, None)
    end, done = open_steps.add_times(times, 5, 4, agg("a", (1, 0.2, "d"), (0, 0.1, "d")), 0)
    assert end == 2 and done is not None and times == {}
    ranks, compute = done.scored()
    assert ranks.tolist() == [2, 3, 1, 0] and compute.tolist() == [0.3, 0.4, 0.2, 0.1]


def test_a_rank_sent_again_keeps_its_last_figures_and_counts_once():
    times: dict[int, open_steps.OpenTimes] = {}
    votes: dict[int, open_steps.OpenVotes] = {}
    first, again, rest = agg("a", (0, 0.1, "d"), (1, 0.2, "d")), agg("a", (1, 0.9, "x")), agg("b", (2, 0.3, "d"))
    for piece in (first, again):
        assert open_steps.add_times(times, 5, 3, piece, 0)[1] is None
        assert open_steps.add_votes(votes, 5, 3, piece, 0)[1] is None
    done, voted = open_steps.add_times(times, 5, 3, rest, 0)[1], open_steps.add_votes(votes, 5, 3, rest, 0)[1]
    assert done is not None and voted is not None
    ranks, compute = done.scored()
    assert ranks.tolist() == [0, 1, 2] and compute.tolist() == [0.1, 0.9, 0.3]
    assert {d: r.tolist() for d, r in voted.by_digest().items() if len(r)} == {"d": [0, 2], "x": [1]}


def test_the_rest_of_an_aggregate_after_its_step_completed_goes_to_a_fresh_track():
    # Rank 0 came, then one aggregate of ranks 1 and 0 again: rank 1 completes the step (world 2)
    # and rank 0's repeat opens the step afresh, as a report after the vote would.
    times: dict[int, open_steps.OpenTimes] = {}
    open_steps.add_times(times, 5, 2, agg("a", (0, 0.1, "d")), 0)
    both = agg("a", (1, 0.2, "d"), (0, 0.5, "d"))
    end, done = open_steps.add_times(times, 5, 2, both, 0)
    assert end == 1 and done is not None and done.scored()[1].tolist() == [0.1, 0.2]
    assert open_steps.add_times(times, 5, 2, both, end) == (2, None)
    assert list(times) == [5] and times[5].count == 1


def test_steps_waiting_past_the_cap_are_given_up_oldest_first():
    times: dict[int, open_steps.OpenTimes] = {}
    for step in range(open_steps.MAX_OPEN_STEPS + 3):
        open_steps.add_times(times, step, 2, agg("a", (0, 0.1, "d")), 0)
    assert sorted(times) == list(range(3, open_steps.MAX_OPEN_STEPS + 3))


def test_many_distinct_digests_are_grouped_by_one_sort():
    votes: dict[int, open_steps.OpenVotes] = {}
    world = 64
    open_steps.add_votes(votes, 5, world, agg("a", (0, 0.1, "d0")), 0)
    open_steps.add_votes(votes, 5, world, agg("a", (0, 0.1, "d0")), 0)  # a repeat: the track turns dense
    for rank in range(1, world):
        _, voted = open_steps.add_votes(votes, 5, world, agg("a", (rank, 0.1, f"d{rank % 40}")), 0)
    assert voted is not None
    grouped = {d: r.tolist() for d, r in voted.by_digest().items()}
    assert grouped == {f"d{k}": [r for r in range(world) if r % 40 == k] for k in range(40)}
    assert np.concatenate(list(voted.by_digest().values())).size == world
