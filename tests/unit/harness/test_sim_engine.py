"""Whole simulated jobs: deterministic per seed, accounted to the second, and in agreement with
the analytic expectation where the model is exact."""

from __future__ import annotations

import math

import pytest

from ftsup.harness.sim.engine import BUCKETS, NoProgress, simulate
from ftsup.harness.sim.fleet import build_fleet
from ftsup.harness.sim.model import Component, SimSpec, analytic
from ftsup.harness.sim.stats import estimate, t975

# 32 nodes failing every ~1.6 h as a fleet: ~75 failures in 5 days, in milliseconds per run.
SMALL = SimSpec(gpus=256, components=(Component("node", 50.0, 1),), job_days=5.0, step_s=10.0,
                checkpoint_s=60.0, detect_s=120.0, restart_s=300.0, warm_restart_s=30.0, spares=8, repair_h=4.0)


def _runs(spec: SimSpec, strategy: str, runs: int, seed: int = 0):
    fleet = build_fleet(spec.nodes, spec.spare_count, spec.gpus_per_node)
    return [simulate(spec, strategy, fleet, seed * 1000 + i) for i in range(runs)]


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    fleet = build_fleet(SMALL.nodes, SMALL.spare_count, SMALL.gpus_per_node)
    for strategy in ("checkpoint_only", "ftsup"):
        assert simulate(SMALL, strategy, fleet, 7) == simulate(SMALL, strategy, fleet, 7)
        assert simulate(SMALL, strategy, fleet, 7) != simulate(SMALL, strategy, fleet, 8)


def test_every_second_of_wall_time_is_in_one_bucket_and_the_useful_ones_are_the_job():
    for strategy in ("checkpoint_only", "ftsup"):
        result = _runs(SMALL, strategy, 1)[0]
        seconds = dict(result.seconds)
        assert tuple(seconds) == BUCKETS
        assert seconds["useful"] == SMALL.job_days * 86400
        assert sum(seconds.values()) == pytest.approx(result.wall_s, rel=1e-9)
        assert all(v >= 0 for v in seconds.values())
        assert result.failures > 30
        assert 0 < result.ettr < 1


def test_without_failures_only_the_pauses_are_lost():
    spec = SimSpec(gpus=64, components=(Component("gpu", 1e12, 1),), job_days=1.0, checkpoint_interval_h=1.0)
    result = _runs(spec, "checkpoint_only", 1)[0]
    assert result.failures == 0
    assert result.wall_s == 86400 + 23 * spec.checkpoint_s  # no checkpoint after the last hour
    ftsup = _runs(spec, "ftsup", 1)[0]
    assert ftsup.wall_s == pytest.approx(86400 + (8640 - 1) * 0.2 + 3 * 60.0)  # every step; 6-hourly checkpoints


def test_ftsup_restores_from_ram_and_checkpoint_only_from_its_checkpoint():
    ftsup = _runs(SMALL, "ftsup", 1)[0]
    baseline = _runs(SMALL, "checkpoint_only", 1)[0]
    assert ftsup.restores_from_ram > 30 and ftsup.restores_from_checkpoint <= 2
    assert baseline.restores_from_ram == 0 and baseline.restores_from_checkpoint > 30
    assert dict(ftsup.seconds)["lost_work"] < dict(baseline.seconds)["lost_work"] / 50


@pytest.mark.parametrize("strategy", ["checkpoint_only", "ftsup"])
def test_the_simulated_ettr_agrees_with_the_renewal_model_within_its_confidence_interval(strategy):
    runs = _runs(SMALL, strategy, 20)
    ettr = estimate([r.ettr for r in runs])
    model = analytic(SMALL, strategy)
    assert ettr.ci95 is not None
    assert ettr.contains(model.ettr_expected), (ettr, model)
    assert ettr.ci95[1] - ettr.ci95[0] < 0.02  # tight enough to mean something


def test_with_no_spares_the_job_waits_for_repaired_nodes():
    spec = SimSpec(gpus=256, components=(Component("node", 50.0, 1),), job_days=2.0, spares=0, repair_h=2.0)
    result = _runs(spec, "ftsup", 1)[0]
    assert result.waits_for_spares > 10
    assert dict(result.seconds)["waiting_for_spares"] > 10 * 0.9 * 2 * 3600


def test_a_node_lost_with_its_buddy_falls_back_to_the_checkpoint():
    # Detection takes 100 s and failures come every ~2 min: buddies often die together.
    spec = SimSpec(gpus=64, components=(Component("node", 0.25, 1),), job_days=0.1, heartbeat_s=50.0,
                   heartbeat_misses=2, spares=16, repair_h=0.5, warm_restart_s=10.0, restart_s=30.0,
                   ftsup_checkpoint_h=0.05, checkpoint_s=5.0)
    results = _runs(spec, "ftsup", 2)
    assert sum(r.restores_from_checkpoint for r in results) > 0
    assert sum(r.restores_from_ram for r in results) > 0


def test_a_job_that_cannot_outrun_its_failures_is_reported_not_simulated_forever():
    spec = SimSpec(gpus=64, components=(Component("node", 1.0, 1),), job_days=1.0, restart_s=7200.0)
    with pytest.raises(NoProgress, match="the renewal model expects an ETTR of"):
        _runs(spec, "checkpoint_only", 1)


def test_the_t_quantiles_shrink_towards_the_normal():
    assert t975(1) == 12.706 and t975(30) == 2.042 and t975(1000) == 1.960
    assert estimate([0.5]).ci95 is None
    low, high = estimate([1.0, 2.0, 3.0]).ci95 or (math.nan, math.nan)
    assert (low + high) / 2 == 2.0 and high - low == pytest.approx(2 * 4.303 / math.sqrt(3))
