"""Closed-form numbers of `ftsup sim`: exact, and every bad input named."""

from __future__ import annotations

import math

import pytest

from ftsup.harness.sim.model import (
    Component,
    SimSpec,
    analytic,
    expected_segment_s,
    parse_component,
    poisson_quantile,
)


def test_node_mtbf_is_the_inverse_of_the_summed_part_rates():
    spec = SimSpec(gpus=64, components=(Component("gpu", 50_000.0, 8), Component("nic", 100_000.0, 2)))
    assert spec.node_rate_per_h == 8 / 50_000 + 2 / 100_000
    assert spec.node_mtbf_h == 1 / (8 / 50_000 + 2 / 100_000)
    assert spec.fleet_mtbf_h == spec.node_mtbf_h / 8


def test_fleet_mtbf_failures_and_young_daly_interval_match_hand_computed_values():
    # One part of MTTF 1000 h per node, 8 nodes: fleet MTBF 125 h; 30 days = 720 h -> 5.76 failures;
    # C = 450 s = 0.125 h -> sqrt(2 * 0.125 * 125) = sqrt(31.25) h.
    spec = SimSpec(gpus=8, gpus_per_node=1, components=(Component("gpu", 1000.0, 1),), job_days=30, checkpoint_s=450)
    assert spec.nodes == 8
    assert spec.node_mtbf_h == 1000.0
    assert spec.fleet_mtbf_h == 125.0
    assert spec.expected_failures == 5.76
    assert spec.young_daly_interval_h == math.sqrt(31.25)
    assert spec.checkpoint_interval_s == math.sqrt(31.25) * 3600


def test_defaults_put_a_failure_every_3_3_hours_on_16k_gpus_and_every_33_minutes_on_100k():
    assert SimSpec(gpus=16_384).fleet_mtbf_h == pytest.approx(3.344, abs=1e-3)  # Llama 3: ~3 h
    assert SimSpec(gpus=100_000).fleet_mtbf_h * 60 == pytest.approx(32.88, abs=0.01)


def test_daly_higher_order_is_close_to_first_order_when_checkpoints_are_cheap():
    spec = SimSpec(gpus=1000)
    assert spec.daly_higher_order_interval_h == pytest.approx(spec.young_daly_interval_h, rel=0.02)
    assert spec.daly_higher_order_interval_h != spec.young_daly_interval_h


def test_an_explicit_checkpoint_interval_overrides_young_daly():
    assert SimSpec(gpus=1000, checkpoint_interval_h=2.0).checkpoint_interval_s == 7200.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu", "is not NAME:MTTF_HOURS:COUNT_PER_NODE"),
        ("gpu:100", "is not NAME:MTTF_HOURS:COUNT_PER_NODE"),
        ("gpu:abc:8", "MTTF 'abc' is not a number"),
        ("gpu:-5:8", "MTTF must be a positive number of hours, got -5.0"),
        ("gpu:0:8", "MTTF must be a positive number of hours, got 0.0"),
        ("gpu:nan:8", "MTTF must be a positive number"),
        ("gpu:100:0", "count per node must be >= 1, got 0"),
        ("gpu:100:2.5", "count '2.5' is not a whole number"),
    ],
)
def test_malformed_components_are_refused_naming_the_value(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_component(text)


def test_a_component_parses_name_mttf_and_count():
    assert parse_component("psu:400000:2") == Component("psu", 400_000.0, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": 0}, "--gpus must be >= 1, got 0"),
        ({"gpus": 1001}, "--gpus 1001 is not divisible by --gpus-per-node 8"),
        ({"gpus": 64, "gpus_per_node": 0}, "--gpus-per-node must be within"),
        ({"gpus": 64, "job_days": 0}, "--job-days must be within"),
        ({"gpus": 64, "checkpoint_s": -1}, "--checkpoint-s must be within"),
        ({"gpus": 64, "components": ()}, "at least one --component"),
        ({"gpus": 64, "components": (Component("a", 1.0, 1), Component("a", 2.0, 1))}, "must be unique"),
        ({"gpus": 64, "spares": -1}, "--spares must be within"),
    ],
)
def test_bad_specs_are_refused_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimSpec(**kwargs)


def test_default_spares_cover_the_nodes_in_repair_with_a_small_tail():
    spec = SimSpec(gpus=100_000)
    in_repair = spec.nodes * spec.node_rate_per_h * spec.repair_h
    assert in_repair < spec.spare_count < in_repair + 4 * math.sqrt(in_repair)
    assert poisson_quantile(0.0, 1e-3) == 0
    assert poisson_quantile(1.0, 0.5) == 1  # P(X > 1) = 0.264 < 0.5, P(X > 0) = 0.632


def test_expected_segment_is_the_segment_itself_when_failures_are_rare():
    assert expected_segment_s(100.0, 50.0, 1e12) == pytest.approx(100.0, rel=1e-9)
    assert expected_segment_s(100.0, 50.0, 1000.0) > 100.0 + 50.0 * 100.0 / 1000.0


def test_first_order_and_renewal_models_agree_where_interval_and_recovery_are_small_against_the_mtbf():
    spec = SimSpec(gpus=1000)  # MTBF 55 h; interval 1.35 h, recovery 0.25 h
    for strategy in ("checkpoint_only", "ftsup"):
        model = analytic(spec, strategy)
        assert model.ettr_first_order == pytest.approx(model.ettr_expected, abs=1e-3)


def test_the_first_order_model_breaks_down_when_recovery_is_comparable_to_the_mtbf():
    model = analytic(SimSpec(gpus=100_000), "checkpoint_only")  # MTBF 33 min, recovery 15 min
    assert model.ettr_expected - model.ettr_first_order > 0.1


def test_unknown_strategies_are_refused():
    with pytest.raises(ValueError, match="unknown strategy 'bogus'"):
        analytic(SimSpec(gpus=8), "bogus")
