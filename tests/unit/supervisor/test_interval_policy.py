"""Checkpoint interval (Young/Daly) from the event log: hand-computed values and the fallbacks."""

from __future__ import annotations

import pytest

from ftsup.supervisor.core.events import (
    CheckpointAborted,
    CheckpointCommitted,
    CheckpointStarted,
    EndReason,
    GenerationEnded,
    GenerationStarted,
    JobCompleted,
    NodeDeclaredDead,
    Record,
)
from ftsup.supervisor.core.policies.interval import (
    Formula,
    IntervalConfig,
    checkpoint_interval_view,
    daly_interval_s,
    young_interval_s,
)

T0 = 1_000.0


class Log:
    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, t: float, event: object) -> Log:
        self.records.append(Record(seq=len(self.records) + 1, term=1, time_unix_s=t, event=event))
        return self

    def started(self, t: float, generation: int = 1) -> Log:
        return self.add(t, GenerationStarted(generation, (), 4, "h", 1, None, 0, (), "test"))

    def failed(self, t: float, reason: EndReason = EndReason.NODE_LOST, generation: int = 1) -> Log:
        return self.add(t, GenerationEnded(generation, reason, "n1", 10, "test"))

    def checkpoint(self, started: float, cost_s: float, cid: str, step: int) -> Log:
        self.add(started, CheckpointStarted(cid, 1, step, 1, "s3://b/p"))
        return self.add(started + cost_s, CheckpointCommitted(cid, step, f"{cid}/manifest"))


def test_young_and_daly_match_hand_computed_values():
    # sqrt(2 * 30 * 3600) = sqrt(216000) = 464.758
    assert young_interval_s(30, 3600) == pytest.approx(464.758, abs=1e-3)
    # r = 30 / 7200 = 0.0041667: 464.758 * (1 + 0.0645497 / 3 + 0.0041667 / 9) - 30 = 444.973
    assert daly_interval_s(30, 3600) == pytest.approx(444.973, abs=1e-3)
    # Daly: once C >= 2M, checkpoint every M
    assert daly_interval_s(100, 40) == 40


def test_no_failures_and_no_checkpoints_use_the_configured_prior_and_estimate():
    config = IntervalConfig(prior_mtbf_s=3600, checkpoint_cost_s=30, min_failures=3)
    advice = checkpoint_interval_view(Log().started(T0).records, config, now=T0 + 500)
    assert advice.interval_s == pytest.approx(464.758, abs=1e-3)
    assert not advice.is_cost_measured and not advice.is_mtbf_observed and advice.failures == 0
    assert "configured estimate" in advice.reason and "configured prior" in advice.reason
    assert "= 7.7min (465s)" in advice.reason and "C = 30.0s" in advice.reason


def test_observed_mtbf_and_measured_cost_replace_the_fallbacks_once_enough_failures_are_seen():
    log = Log().started(T0)
    log.checkpoint(T0 + 100, 10, "c1", 10).checkpoint(T0 + 200, 20, "c2", 20).checkpoint(T0 + 300, 60, "c3", 30)
    log.failed(T0 + 1000).started(T0 + 1010, 2).failed(T0 + 2000, EndReason.XID, 2)
    log.started(T0 + 2010, 3).failed(T0 + 3000, EndReason.HUNG, 3).started(T0 + 3010, 4)
    config = IntervalConfig(prior_mtbf_s=99_999, checkpoint_cost_s=500, min_failures=3)
    advice = checkpoint_interval_view(log.records, config, now=T0 + 6000)
    # C = median(10, 20, 60) = 20; M = 6000 s / 3 failures = 2000; sqrt(2 * 20 * 2000) = 282.843
    assert (advice.checkpoint_cost_s, advice.mtbf_s, advice.failures) == (20, 2000, 3)
    assert advice.interval_s == pytest.approx(282.843, abs=1e-3)
    assert advice.is_cost_measured and advice.measured_checkpoints == 3 and advice.is_mtbf_observed
    assert "observed: 3 failure(s) in 100.0min (6000s)" in advice.reason


def test_below_min_failures_the_prior_is_kept_and_the_reason_says_how_many_were_seen():
    log = Log().started(T0).failed(T0 + 10).started(T0 + 20, 2).failed(T0 + 30, generation=2)
    advice = checkpoint_interval_view(log.records, IntervalConfig(prior_mtbf_s=7200, min_failures=3), now=T0 + 100)
    assert advice.mtbf_s == 7200 and not advice.is_mtbf_observed and advice.failures == 2
    assert "2 failure(s)" in advice.reason and "used from 3" in advice.reason


def test_operator_restarts_drains_completion_and_spare_deaths_are_not_failures():
    log = Log().started(T0)
    log.failed(T0 + 10, EndReason.OPERATOR_RESTART).failed(T0 + 20, EndReason.NODE_DRAINED)
    log.add(T0 + 30, NodeDeclaredDead("spare-1", "silent", 3.0))  # interrupts nothing
    log.failed(T0 + 40, EndReason.TRAINER_EXITED)
    log.add(T0 + 50, JobCompleted(2, 100, "d"))
    advice = checkpoint_interval_view(log.records, IntervalConfig(min_failures=1), now=T0 + 10_000)
    # one failure; the exposure stops at JobCompleted: 50 s, not 10,000 s
    assert advice.failures == 1 and advice.exposure_s == 50 and advice.mtbf_s == 50


def test_aborted_checkpoints_are_not_costs_and_the_window_reads_the_newest():
    log = Log().started(T0).checkpoint(T0, 100, "c1", 1)
    log.add(T0 + 200, CheckpointStarted("c2", 1, 2, 1, "x")).add(T0 + 900, CheckpointAborted("c2", "shard lost"))
    log.checkpoint(T0 + 1000, 10, "c3", 3).checkpoint(T0 + 1100, 20, "c4", 4)
    advice = checkpoint_interval_view(log.records, IntervalConfig(cost_window=2), now=T0 + 2000)
    assert advice.checkpoint_cost_s == 15 and advice.measured_checkpoints == 2  # median(10, 20)


def test_a_commit_whose_start_predates_the_log_window_is_ignored():
    log = Log().started(T0).add(T0 + 5, CheckpointCommitted("old", 5, "old/manifest"))
    advice = checkpoint_interval_view(log.records, IntervalConfig(checkpoint_cost_s=45), now=T0 + 10)
    assert not advice.is_cost_measured and advice.checkpoint_cost_s == 45


def test_the_interval_is_clamped_and_the_reason_says_so():
    config = IntervalConfig(prior_mtbf_s=100, checkpoint_cost_s=1, min_interval_s=60, max_interval_s=600)
    advice = checkpoint_interval_view([], config, now=T0)
    # sqrt(2 * 1 * 100) = 14.1 s, below the 60 s floor
    assert advice.interval_s == 60 and advice.is_clamped and "14.1s; clamped to [60s, 600s]" in advice.reason


def test_daly_formula_is_selectable():
    config = IntervalConfig(prior_mtbf_s=3600, checkpoint_cost_s=30, formula=Formula.DALY)
    advice = checkpoint_interval_view([], config, now=T0)
    assert advice.interval_s == pytest.approx(444.973, abs=1e-3) and advice.reason.startswith("Daly")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prior_mtbf_s": 0}, "prior_mtbf_s must be a finite number > 0, got 0"),
        ({"checkpoint_cost_s": float("nan")}, "checkpoint_cost_s must be a finite number > 0, got nan"),
        ({"min_interval_s": 100, "max_interval_s": 50}, r"max_interval_s \(50\) must be >= min_interval_s \(100\)"),
        ({"min_failures": 0}, r"min_failures must be in \[1, 10000\], got 0"),
        ({"cost_window": 0}, r"cost_window must be in \[1, 64\], got 0"),
        ({"formula": "young"}, "formula must be one of"),
    ],
)
def test_bad_config_is_refused_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        IntervalConfig(**kwargs)
