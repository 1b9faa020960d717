"""Checkpoint interval policy: Young/Daly from the measured checkpoint cost and the observed MTBF.

Pure, from the event log alone. `observe(obs, record)` folds one record into small immutable
observations (the operator service keeps one and folds each new record, as for goodput);
`advise(obs, config, now)` turns them into an interval and the reasoning behind it;
`checkpoint_interval_view(records, config, now)` does both for a list of records.

Inputs, each with a configured fallback (never "zero" for "unknown"):
- checkpoint cost C: the median of the last `cost_window` CheckpointStarted -> CheckpointCommitted
  durations (aborted attempts are not costs); the configured `checkpoint_cost_s` until one commits.
- job MTBF M: the job's wall time since its first GenerationStarted divided by the failures seen in
  it. A failure is an interruption of the job for a fault: a generation that ended because a node
  died, was quarantined, hit an Xid, hung, restarted, a trainer crashed or replicas split (SDC).
  Operator restarts, drains and completion are not failures, and verdicts on spares that interrupt
  nothing are not counted: Young/Daly needs the rate at which *the job* loses work. Until
  `min_failures` failures are seen the configured `prior_mtbf_s` is used (a couple of early
  failures say little about a rate).

Formulas (T = compute time between checkpoints):
- Young (1974), first order: T = sqrt(2 C M).
- Daly (2006), higher order: T = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C for
  C < 2M, else T = M.
The answer is clamped to [min_interval_s, max_interval_s] and the reason says so.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from ftsup.supervisor.core import frozen
from ftsup.supervisor.core.events import (
    FAILURE_REASONS,
    CheckpointAborted,
    CheckpointCommitted,
    CheckpointStarted,
    EndReason,
    GenerationEnded,
    GenerationStarted,
    JobCompleted,
    Record,
)
from ftsup.supervisor.core.limits import KEEP_CHECKPOINT_COSTS

KEEP_COSTS = KEEP_CHECKPOINT_COSTS  # measured costs remembered (the window reads the newest ones)


class Formula(enum.Enum):
    YOUNG = "young"
    DALY = "daly"


@dataclass(frozen=True, slots=True)
class IntervalConfig:
    prior_mtbf_s: float = 24 * 3600.0  # the job's MTBF assumed until min_failures are seen
    min_failures: int = 3
    checkpoint_cost_s: float = 60.0  # assumed checkpoint cost until one has been measured
    cost_window: int = 5  # median of this many newest measured costs
    formula: Formula = Formula.YOUNG
    min_interval_s: float = 60.0
    max_interval_s: float = 24 * 3600.0

    def __post_init__(self) -> None:
        for name in ("prior_mtbf_s", "checkpoint_cost_s", "min_interval_s", "max_interval_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.max_interval_s < self.min_interval_s:
            raise ValueError(
                f"max_interval_s ({self.max_interval_s:g}) must be >= min_interval_s ({self.min_interval_s:g})"
            )
        if not 1 <= self.min_failures <= 10_000:
            raise ValueError(f"min_failures must be in [1, 10000], got {self.min_failures!r}")
        if not 1 <= self.cost_window <= KEEP_COSTS:
            raise ValueError(f"cost_window must be in [1, {KEEP_COSTS}], got {self.cost_window!r}")
        if not isinstance(self.formula, Formula):
            raise ValueError(f"formula must be one of {[f.value for f in Formula]}, got {self.formula!r}")


@dataclass(frozen=True, slots=True)
class Failure:
    time_unix_s: float
    generation: int
    reason: EndReason
    node_id: str


@dataclass(frozen=True, slots=True)
class IntervalObservations:
    """What the policy needs from the log so far. Never mutated: `observe` returns a new one."""

    job_started_s: float | None = None  # wall time of the first GenerationStarted
    job_completed_s: float | None = None  # wall time of JobCompleted: the exposure stops there
    failures: tuple[Failure, ...] = ()
    costs_s: tuple[float, ...] = ()  # measured checkpoint costs, oldest first, at most KEEP_COSTS
    open_checkpoint: tuple[str, float] | None = None  # (id, started wall time) in flight


@dataclass(frozen=True, slots=True)
class IntervalAdvice:
    interval_s: float
    reason: str  # the numbers and where each came from
    formula: Formula
    checkpoint_cost_s: float
    is_cost_measured: bool
    measured_checkpoints: int  # costs the median was taken over (0: configured estimate)
    mtbf_s: float
    is_mtbf_observed: bool
    failures: int
    exposure_s: float  # the job's wall time the failures were seen in
    is_clamped: bool


def observe(obs: IntervalObservations, record: Record) -> IntervalObservations:
    """Folds one log record into the observations."""
    t = record.time_unix_s
    match record.event:
        case GenerationStarted() if obs.job_started_s is None:
            return frozen.replace(obs, job_started_s=t)
        case GenerationEnded(generation=generation, reason=reason, node_id=node_id) if reason in FAILURE_REASONS:
            return frozen.replace(obs, failures=(*obs.failures, Failure(t, generation, reason, node_id)))
        case JobCompleted():
            return frozen.replace(obs, job_completed_s=t)
        case CheckpointStarted(checkpoint_id=checkpoint_id):
            return frozen.replace(obs, open_checkpoint=(checkpoint_id, t))
        case CheckpointCommitted(checkpoint_id=checkpoint_id):
            if obs.open_checkpoint is None or obs.open_checkpoint[0] != checkpoint_id:
                return obs  # started before the log window we saw (a compacted log): no duration
            cost = max(0.0, t - obs.open_checkpoint[1])  # a new leader's clock may lag
            return frozen.replace(obs, costs_s=(*obs.costs_s, cost)[-KEEP_COSTS:], open_checkpoint=None)
        case CheckpointAborted(checkpoint_id=checkpoint_id):
            if obs.open_checkpoint is not None and obs.open_checkpoint[0] == checkpoint_id:
                return frozen.replace(obs, open_checkpoint=None)
    return obs


def advise(obs: IntervalObservations, config: IntervalConfig, now: float) -> IntervalAdvice:
    """The checkpoint interval for `obs` at wall time `now`, and why."""
    window = obs.costs_s[-config.cost_window:]
    if window:
        cost = statistics.median(window)
        cost_text = (
            f"C = {cost:.1f}s, median of the last {len(window)} measured checkpoint(s)"
            " (CheckpointStarted -> CheckpointCommitted)"
        )
    else:
        cost = config.checkpoint_cost_s
        cost_text = f"C = {cost:.1f}s, configured estimate (no checkpoint committed yet)"
    if cost <= 0:  # a checkpoint committed within the clock's resolution: use the estimate's floor
        cost = min(config.checkpoint_cost_s, 1.0)
        cost_text += f", floored to {cost:g}s"

    end = obs.job_completed_s if obs.job_completed_s is not None else now
    exposure = max(0.0, end - obs.job_started_s) if obs.job_started_s is not None else 0.0
    seen = len(obs.failures)
    is_observed = seen >= config.min_failures and exposure > 0
    if is_observed:
        mtbf = exposure / seen
        mtbf_text = f"M = {_duration(mtbf)}, observed: {seen} failure(s) in {_duration(exposure)} of the job"
    else:
        mtbf = config.prior_mtbf_s
        mtbf_text = (
            f"M = {_duration(mtbf)}, configured prior ({seen} failure(s) in {_duration(exposure)} of the job;"
            f" the observed rate is used from {config.min_failures})"
        )

    raw, formula_text = _interval(cost, mtbf, config.formula)
    interval = min(max(raw, config.min_interval_s), config.max_interval_s)
    clamped = interval != raw
    clamp_text = f"; clamped to [{config.min_interval_s:g}s, {config.max_interval_s:g}s]" if clamped else ""
    reason = f"{formula_text} = {_duration(raw)}{clamp_text}; {cost_text}; {mtbf_text}"
    return IntervalAdvice(
        interval_s=interval,
        reason=reason,
        formula=config.formula,
        checkpoint_cost_s=cost,
        is_cost_measured=bool(window),
        measured_checkpoints=len(window),
        mtbf_s=mtbf,
        is_mtbf_observed=is_observed,
        failures=seen,
        exposure_s=exposure,
        is_clamped=clamped,
    )


def checkpoint_interval_view(records: Iterable[Record], config: IntervalConfig, now: float) -> IntervalAdvice:
    """Folds `records` (oldest first) and advises: the entry point for `supervisorctl checkpoints`."""
    obs = IntervalObservations()
    for record in records:
        obs = observe(obs, record)
    return advise(obs, config, now)


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: sqrt(2 C M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (Daly 2006, eq. 37); M itself once C >= 2M."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return young_interval_s(cost_s, mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


def _interval(cost: float, mtbf: float, formula: Formula) -> tuple[float, str]:
    if formula is Formula.YOUNG:
        return young_interval_s(cost, mtbf), f"Young: sqrt(2 x C {cost:.1f}s x M {mtbf:.0f}s)"
    return daly_interval_s(cost, mtbf), f"Daly: higher-order optimum for C {cost:.1f}s, M {mtbf:.0f}s"


def _duration(seconds: float) -> str:
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f}h ({seconds:.0f}s)"
    if seconds >= 120:
        return f"{seconds / 60:.1f}min ({seconds:.0f}s)"
    return f"{seconds:.1f}s"
