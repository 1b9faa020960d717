"""Replications to a mean and a 95 % confidence interval (Student's t, since runs are few)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom; beyond, the normal's.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.960


@dataclass(frozen=True, slots=True)
class Estimate:
    mean: float
    stdev: float | None  # None with one run
    ci95: tuple[float, float] | None

    def contains(self, value: float) -> bool:
        return self.ci95 is not None and self.ci95[0] <= value <= self.ci95[1]


def estimate(values: list[float]) -> Estimate:
    if not values:
        raise ValueError("no values to estimate from")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(mean, None, None)
    stdev = statistics.stdev(values)
    half = t975(len(values) - 1) * stdev / math.sqrt(len(values))
    return Estimate(mean, stdev, (mean - half, mean + half))
