"""Metrics fed a node's ranks at once: a histogram and each rank's latest figures, as arrays.

The leader observes every rank's step and compute time of every step (issue 14: 100,000 ranks a
step at full size). prometheus_client's Histogram takes one value per call (a lock, a walk of the
buckets), and the latest figures were one object per rank per step: ~50 µs of the leader's loop
per node-step aggregate, as much as the core's whole decision on it. Here a node's eight values are
one `searchsorted` and one `bincount` into the bucket counts, and the latest figures are rows of
arrays indexed by rank; the caller (supervisor/metrics.py) hands them many nodes' aggregates at
once, so numpy's cost per call (~1 µs, whatever the size) is paid per batch, not per node. The
exposition is the one prometheus_client writes for a Histogram (cumulative `_bucket` series with
`le`, `_count`, `_sum`, `_created`), so dashboards and alerts read the same series
(tests/unit/supervisor/test_metrics_arrays.py compares both).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

NO_STEP = -1  # a rank that reported nothing (since the last clear)


class ArrayHistogram(Collector):
    """A Prometheus histogram without labels that takes arrays of observations."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 before_collect: Callable[[], None] | None = None) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be increasing, got {bounds}")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._name, self._documentation = name, documentation
        self._bounds = np.array(bounds, dtype=np.float64)
        self._counts = np.zeros(len(bounds), dtype=np.int64)  # per bucket, not cumulative
        self._sum = 0.0
        self._created = time.time()
        self._lock = threading.Lock()  # (a scrape may read from another thread)
        self._before_collect = before_collect  # (the owner folds what it kept back)

    def observe_many(self, values: Floats) -> None:
        """Each value in the first bucket whose bound it does not exceed, as Histogram.observe
        puts it; a NaN falls in no bucket and makes the sum NaN, as there."""
        if not len(values):
            return
        slots = np.searchsorted(self._bounds, values, side="left")  # (NaN sorts past every bound)
        counts = np.bincount(slots, minlength=len(self._bounds) + 1)[: len(self._bounds)]
        total = float(values.sum())
        with self._lock:
            self._counts += counts
            self._sum += total

    def observe(self, value: float) -> None:
        self.observe_many(np.array([value], dtype=np.float64))

    def describe(self) -> Sequence[Metric]:
        return [self._family()]  # (the registry's name check: nothing folded for it)

    def collect(self) -> Iterator[Metric]:
        if self._before_collect is not None:
            self._before_collect()
        yield self._family()

    def _family(self) -> Metric:
        with self._lock:
            cumulative, total = np.cumsum(self._counts).tolist(), self._sum
        family = HistogramMetricFamily(
            self._name, self._documentation,
            buckets=[(floatToGoString(bound), count) for bound, count in zip(self._bounds.tolist(), cumulative)],
            sum_value=total,
        )
        family.add_sample(f"{self._name}_created", {}, self._created)
        return family


class LatestByRank:
    """Each rank's newest step, step time, compute time and tokens, as arrays indexed by rank.
    A report of an older step than the one held for its rank is ignored (as per rank before)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """A new world may number its ranks differently: forget them all."""
        self.step: Ints = np.full(0, NO_STEP, dtype=np.int64)
        self.step_time_s: Floats = np.zeros(0, dtype=np.float64)
        self.compute_time_s: Floats = np.zeros(0, dtype=np.float64)
        self.tokens: Ints = np.zeros(0, dtype=np.int64)

    def _hold(self, top_rank: int) -> None:
        size = len(self.step)
        if top_rank < size:
            return
        grown = max(top_rank + 1, 2 * size, 64)
        self.step = np.concatenate([self.step, np.full(grown - size, NO_STEP, dtype=np.int64)])
        self.step_time_s = np.concatenate([self.step_time_s, np.zeros(grown - size)])
        self.compute_time_s = np.concatenate([self.compute_time_s, np.zeros(grown - size)])
        self.tokens = np.concatenate([self.tokens, np.zeros(grown - size, dtype=np.int64)])

    def update(self, ranks: Ints, steps: Ints, step_time_s: Floats, compute_time_s: Floats, tokens: Ints) -> None:
        """Reports in arrival order (`steps` one per report): each rank ends with its newest step's
        last report, unless it already held a newer step, as reports folded one by one would leave it."""
        if not len(ranks):
            return
        self._hold(int(ranks.max()))
        order = np.lexsort((steps, ranks))  # by rank, then step; stable: arrival order within a tie
        by_rank = ranks[order]
        newest = order[np.flatnonzero(np.append(by_rank[1:] != by_rank[:-1], True))]  # each rank's last
        newest = newest[self.step[ranks[newest]] <= steps[newest]]
        held = ranks[newest]
        self.step[held] = steps[newest]
        self.step_time_s[held] = step_time_s[newest]
        self.compute_time_s[held] = compute_time_s[newest]
        self.tokens[held] = tokens[newest]

    def known(self) -> Ints:
        """The ranks that reported, in order."""
        return np.flatnonzero(self.step != NO_STEP)

    def tokens_per_s(self) -> float:
        """Σ over ranks of tokens / step time (ranks step in lock-step: the job's rate); NaN: none."""
        rated = (self.step != NO_STEP) & (self.tokens != 0) & (self.step_time_s > 0)
        if not rated.any():
            return math.nan
        with np.errstate(over="ignore"):  # (a step time that small: inf, as the division one by one)
            return float((self.tokens[rated] / self.step_time_s[rated]).sum())
