"""Array-fed metrics (supervisor/metrics_arrays.py) expose what their one-value-at-a-time
counterparts did: prometheus_client's Histogram for the same observations (bucket edges, NaN,
infinities), and the per-rank latest figures kept as a dict of the newest report per rank."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from ftsup.supervisor.core.events import EndReason, GenerationEnded, Record
from ftsup.supervisor.core.inputs import StepReport
from ftsup.supervisor.metrics import STEP_BUCKETS, SupervisorMetrics
from ftsup.supervisor.metrics_arrays import ArrayHistogram, LatestByRank

values = st.one_of(st.sampled_from([*STEP_BUCKETS, 0.0, math.inf, math.nan, 1e-9]),
                   st.floats(min_value=0.0, max_value=400.0))


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in registry.collect():
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(values, max_size=9), max_size=6))
def test_the_histogram_exposes_what_prometheus_clients_does_for_the_same_values(batches):
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("h_seconds", "doc", buckets=STEP_BUCKETS, registry=theirs)
    arrays = ArrayHistogram("h_seconds", "doc", STEP_BUCKETS)
    ours.register(arrays)
    for batch in batches:
        for value in batch:
            reference.observe(value)
        arrays.observe_many(np.array(batch, dtype=np.float64))
    expected, got = _samples(theirs), _samples(ours)
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        assert (math.isnan(value) and math.isnan(got[key])) or got[key] == pytest.approx(value), key


def test_the_text_exposition_has_the_histograms_series_and_its_creation_time():
    registry = CollectorRegistry()
    histogram = ArrayHistogram("ftsup_step_seconds", "Training step wall time, every rank", STEP_BUCKETS)
    registry.register(histogram)
    histogram.observe_many(np.array([0.5, 0.5, 2.0]))
    histogram.observe(400.0)
    text = generate_latest(registry).decode()
    assert "# TYPE ftsup_step_seconds histogram" in text
    assert 'ftsup_step_seconds_bucket{le="0.5"} 2.0' in text
    assert 'ftsup_step_seconds_bucket{le="+Inf"} 4.0' in text
    assert "ftsup_step_seconds_count 4.0" in text and "ftsup_step_seconds_sum 403.0" in text
    assert "ftsup_step_seconds_created " in text


def test_buckets_out_of_order_are_refused():
    with pytest.raises(ValueError, match="increasing"):
        ArrayHistogram("h", "doc", (1.0, 0.5))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 200), min_size=1, max_size=8, unique=True), st.integers(0, 5),
                          st.floats(0.0, 10.0), st.integers(0, 4096)), max_size=12), st.integers(1, 4))
def test_the_latest_figures_per_rank_are_the_newest_report_of_each_rank(reports, batch):
    """Fed in batches of `batch` nodes' reports (ranks repeat across a batch, steps go back and
    forth), against a dict updated report by report: newer or equal step wins."""
    latest, reference = LatestByRank(), {}
    for start in range(0, len(reports), batch):
        chunk = reports[start:start + batch]
        if not chunk:
            continue
        times = [np.array([step_s + r / 1000 for r in ranks]) for ranks, _, step_s, _ in chunk]
        latest.update(np.concatenate([np.array(ranks, dtype=np.int64) for ranks, _, _, _ in chunk]),
                      np.concatenate([np.full(len(ranks), step, dtype=np.int64) for ranks, step, _, _ in chunk]),
                      np.concatenate(times), np.concatenate(times) / 2,
                      np.concatenate([np.full(len(ranks), tokens, dtype=np.int64) for ranks, _, _, tokens in chunk]))
        for (ranks, step, _, tokens), values in zip(chunk, times):
            for rank, value in zip(ranks, values.tolist()):
                if rank not in reference or step >= reference[rank][0]:
                    reference[rank] = (step, value, value / 2, tokens)
    assert latest.known().tolist() == sorted(reference)
    for rank, (step, step_s, compute_s, tokens) in reference.items():
        assert (latest.step[rank], latest.step_time_s[rank], latest.compute_time_s[rank], latest.tokens[rank]) == (
            step, step_s, compute_s, tokens)
    rates = [t / s for _, s, _, t in reference.values() if t and s > 0]
    expected = sum(rates) if rates else math.nan
    rate = latest.tokens_per_s()
    assert (math.isnan(expected) and math.isnan(rate)) or rate == pytest.approx(expected)
    latest.clear()
    assert latest.known().tolist() == [] and math.isnan(latest.tokens_per_s())


def test_kept_aggregates_are_folded_before_any_read_and_a_generations_end_keeps_them_in_the_histograms():
    metrics = SupervisorMetrics()
    for rank in (1, 0):
        metrics.on_input(StepReport("n1", 1, rank, 3, 0.5, 0.4, 2.0 + rank, "d", grad_norm=0.5, tokens=100), None)
    assert metrics.tokens_per_s() == pytest.approx(400.0)  # (read: folded first)
    assert metrics._loss == 2.0
    metrics.on_input(StepReport("n1", 1, 0, 4, 0.5, 0.4, 1.5, "d", tokens=100), None)
    metrics.on_record(Record(1, 0, 0.0, GenerationEnded(1, EndReason.NODE_LOST, "n1", 4, "gone")))
    assert math.isnan(metrics.tokens_per_s()) and metrics._loss == 1.5
    text = generate_latest(metrics.registry).decode()
    assert "ftsup_step_seconds_count 3.0" in text and "ftsup_compute_seconds_count 3.0" in text
