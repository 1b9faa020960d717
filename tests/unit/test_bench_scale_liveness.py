"""`ftsup bench scale` reads each shard's liveness-admission histogram over the window: the
quantiles are the upper bounds of the buckets that hold them, from the window's counts only."""

from __future__ import annotations

import math

from ftsup.bench import scale


def test_quantiles_come_from_the_windows_bucket_counts_not_the_histograms_history():
    before = {0.05: 90.0, 0.1: 100.0, 0.5: 100.0, math.inf: 100.0}  # (before the window: all fast)
    after = {0.05: 140.0, 0.1: 197.0, 0.5: 199.0, math.inf: 200.0}  # window: 50 <= 50 ms, 47 <= 0.1 s, ...
    figures = scale._window_quantiles(before, after)
    assert figures == {"count": 100, "p50_ms_at_most": 50.0, "p99_ms_at_most": 500.0}
    assert scale._window_quantiles(before, {**after, math.inf: 300.0})["p99_ms_at_most"] is None, \
        "past the largest bound: unknown, not the bound"
    assert scale._window_quantiles(after, after) == {"count": 0, "p50_ms_at_most": None, "p99_ms_at_most": None}
    assert scale._window_quantiles(None, after) is None, "a shard that did not answer its scrape"


def test_a_replicas_ticks_late_are_counted_past_300_ms_and_1_s():
    before = {0.1: 10.0, 0.2: 10.0, 0.3: 10.0, 1.0: 10.0, 2.0: 10.0, math.inf: 10.0}
    after = {0.1: 100.0, 0.2: 105.0, 0.3: 106.0, 1.0: 109.0, 2.0: 110.0, math.inf: 110.0}
    assert scale._late_figures(before, after) == {"ticks": 100, "p99_ms_at_most": 1000.0, "over_300ms": 4,
                                                  "over_1s": 1}
