"""The array straggler detector decides exactly what the per-rank tuple detector it replaced
decided (tests/support/reference_detectors.py): the same flags and clears, in the same order,
with the same evidence (window scores bit for bit, steps, counts, reasons), and the same windows
left behind, over random traces: ranks missing from some steps, whole-cohort stalls, a rank slowed
mid-way and recovering, cohorts too small to score, stale steps, the world growing and shrinking."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core.policies.straggler import StragglerConfig, StragglerState, observe_step, observe_times
from tests.support.reference_detectors import RefStragglerState, ref_observe_step

CONFIGS = [
    StragglerConfig(),
    StragglerConfig(window_steps=4, flag_min_over=3, clear_max_over=1, flag_z=2.0, clear_z=1.0, min_ranks=3),
    StragglerConfig(window_steps=1, flag_min_over=1, clear_max_over=0, flag_z=1.0, clear_z=0.5, min_ranks=3),
]


def trace(seed: int, steps: int) -> list[tuple[int, dict[int, float]]]:
    """(step, rank -> compute time) rows: world sizes that change every so often, ranks dropped,
    stalls, a slow rank that comes and goes, identical times, and now and then a stale step."""
    rng = random.Random(seed)
    rows = []
    world, slow, step = rng.randint(1, 24), None, 0
    for _ in range(steps):
        if rng.random() < 0.08:
            world = rng.randint(1, 40)  # a new world size (a later generation's layout, replayed on one detector)
        if rng.random() < 0.1:
            slow = rng.randrange(world) if slow is None else None
        step += rng.choice([1, 1, 1, 2, 0, -1])  # repeats and older steps are stale
        stall = rng.choice([0.0] * 8 + [2.5])
        flat = rng.random() < 0.05  # every rank the same time: the spread floor carries the score
        times = {}
        for rank in rng.sample(range(world), k=world):  # arrival order is random too
            if rng.random() < 0.1:
                continue  # missing from this step
            t = 1.0 if flat else rng.lognormvariate(0.0, 0.03) * (rng.choice([1.3, 1.6, 3.0]) if rank == slow else 1.0)
            times[rank] = t + stall
        rows.append((step, times))
    return rows


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**9), st.integers(1, 120), st.sampled_from(range(len(CONFIGS))))
def test_array_detector_gives_the_reference_verdicts_and_windows(seed, steps, which):
    config = CONFIGS[which]
    ref, arrays = RefStragglerState(), StragglerState()
    for step, times in trace(seed, steps):
        ref, expected = ref_observe_step(ref, step, times, config)
        assert observe_times(arrays, step, times, config) == expected
        assert arrays.last_step == ref.last_step and arrays.flagged == ref.flagged
    assert {r: (w.steps, w.scores) for r, w in arrays.windows.items()} == {
        r: (w.steps, w.scores) for r, w in ref.windows.items()}


def test_a_slowed_rank_is_flagged_and_cleared_at_the_same_steps_as_the_reference():
    # The story the property test samples, spelled out: rank 5 of 64 turns 20 % slow at step 30
    # and recovers at step 70. Both detectors flag and clear it, at the same steps.
    rng = random.Random(11)
    ref, arrays, config, seen = RefStragglerState(), StragglerState(), StragglerConfig(), []
    for step in range(100):
        times = {r: rng.lognormvariate(0.0, 0.03) * (1.2 if r == 5 and 30 <= step < 70 else 1.0) for r in range(64)}
        ref, expected = ref_observe_step(ref, step, times, config)
        got = observe_times(arrays, step, times, config)
        assert got == expected
        seen += [(v.step, v.is_straggler) for v in got]
    assert [flag for _, flag in seen] == [True, False] and 30 < seen[0][0] < 50 and seen[1][0] > 70


def test_the_detector_reads_its_arrays_not_views_of_the_callers():
    # observe_step keeps no reference to the caller's arrays: changing them afterwards changes nothing.
    state, config = StragglerState(), StragglerConfig(window_steps=2, flag_min_over=1, clear_max_over=0, min_ranks=3)
    ranks, times = np.arange(4, dtype=np.int64), np.array([1.0, 1.0, 1.0, 9.0])
    (verdict,) = observe_step(state, 1, ranks, times, config)
    times[:] = 0.0
    ranks[:] = 0
    assert verdict.rank == 3 and state.window(3).scores == verdict.scores and state.flagged == {3}
