"""Straggler detector: robust per-step scores, persistence and hysteresis."""

from __future__ import annotations

import random

import pytest

from ftsup.supervisor.core.policies.straggler import StragglerConfig, StragglerState, observe_times

CONFIG = StragglerConfig()
RANKS = 16


def cohort(rng: random.Random, slow: dict[int, float] | None = None, stall_s: float = 0.0) -> dict[int, float]:
    """One step's compute times: ~1 s with 3 % jitter, `slow` multiplies ranks, a stall adds to all."""
    slow = slow or {}
    return {r: rng.lognormvariate(0.0, 0.03) * slow.get(r, 1.0) + stall_s for r in range(RANKS)}


def run(steps, config=CONFIG, state=None, first_step=0):
    state = state or StragglerState()
    verdicts = []
    for i, times in enumerate(steps):
        verdicts += observe_times(state, first_step + i, times, config)
    return state, verdicts


def test_whole_cohort_stall_is_not_a_straggler():
    rng = random.Random(1)
    steps = [cohort(rng, stall_s=2.5 if 20 <= i < 40 else 0.0) for i in range(60)]
    state, verdicts = run(steps)
    assert verdicts == [] and state.flagged == frozenset()


def test_single_rank_gc_pauses_are_not_a_straggler():
    rng = random.Random(2)
    steps = [cohort(rng, slow={3: 1.4} if i % 5 == 0 else None) for i in range(100)]
    assert run(steps)[1] == []


def test_persistent_20_percent_slowdown_is_flagged_within_20_steps_with_evidence():
    rng = random.Random(3)
    steps = [cohort(rng) for _ in range(30)] + [cohort(rng, slow={7: 1.2}) for _ in range(30)]
    _, verdicts = run(steps)
    assert [(v.rank, v.is_straggler) for v in verdicts] == [(7, True)]
    flag = verdicts[0]
    assert flag.step - 30 + 1 <= 20
    assert len(flag.scores) == CONFIG.window_steps and flag.over_threshold >= CONFIG.flag_min_over
    assert flag.window == (flag.step - CONFIG.window_steps + 1, flag.step)
    assert flag.compute_time > flag.cohort_median and "straggler" in flag.reason


def test_hysteresis_keeps_a_flag_through_a_dip_and_clears_once_recovered():
    rng = random.Random(4)
    slow = [cohort(rng, slow={2: 1.3}) for _ in range(20)]
    state, verdicts = run(slow)
    assert [(v.rank, v.is_straggler) for v in verdicts] == [(2, True)]
    # Still 7 % slower (z about 2.3): too little to flag afresh, above clear_z (1.5): stays flagged.
    state, verdicts = run([cohort(rng, slow={2: 1.07}) for _ in range(20)], state=state, first_step=20)
    assert verdicts == [] and state.flagged == {2}
    state, verdicts = run([cohort(rng) for _ in range(20)], state=state, first_step=40)
    assert [(v.rank, v.is_straggler) for v in verdicts] == [(2, False)]
    assert state.flagged == frozenset() and "cleared" in verdicts[0].reason


def test_stale_steps_are_ignored_and_small_cohorts_score_nobody():
    rng = random.Random(5)
    state, _ = run([cohort(rng) for _ in range(3)])
    windows = state.windows
    assert observe_times(state, 1, cohort(rng), CONFIG) == [] and state.windows == windows
    assert observe_times(state, 10, {0: 1.0, 1: 5.0}, CONFIG) == []
    assert state.last_step == 10 and state.windows == windows


def test_identical_times_do_not_blow_up_the_score():
    times = {r: 1.0 for r in range(RANKS)}
    times[0] = 1.004  # 0.4 % slower: under the min_rel_spread floor, not a straggler
    assert run([times] * 30)[1] == []


@pytest.mark.parametrize(
    "kwargs",
    [{"window_steps": 0}, {"flag_min_over": 17}, {"clear_max_over": 11}, {"clear_z": 4.0}, {"min_ranks": 2},
     {"min_rel_spread": 0.0}],
)
def test_bad_config_is_refused_naming_the_value(kwargs):
    with pytest.raises(ValueError, match=str(next(iter(kwargs.values())))):
        StragglerConfig(**kwargs)
