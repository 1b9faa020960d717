"""The simulator's inputs and every closed-form number it prints beside the simulation.

A node fails when any of its parts fails (a series system of exponential parts), so the node
failure rate is the sum of count/MTTF over its component kinds; a gang-scheduled job fails when
any of its nodes does, so fleet MTBF = node MTBF / nodes. The checkpoint interval is Young/Daly's
first-order optimum sqrt(2 C M) (Young 1974, Daly 2006). The analytic ETTR is the renewal model
for exponential failures that strike at any time, recovery included (Daly 2006, eq. 7): a segment
needing x seconds of uninterrupted wall time, with R seconds of recovery after every failure,
takes e^(R/M) M (e^(x/M) - 1) seconds on average.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

HOUR_S = 3600.0
DAY_S = 86400.0

YOUNG_DALY_FORMULA = "sqrt(2 * checkpoint_s * fleet_mtbf) (Young/Daly first order)"
STRATEGIES = ("checkpoint_only", "ftsup")

_COMPONENT = re.compile(r"^([A-Za-z][A-Za-z0-9_-]{0,31}):([^:]+):([^:]+)$")


@dataclass(frozen=True, slots=True)
class Component:
    """One kind of part in every node: `count` of them, each failing after `mttf_h` on average."""

    name: str
    mttf_h: float
    count: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mttf_h) and self.mttf_h > 0):
            raise ValueError(f"component {self.name!r}: MTTF must be a positive number of hours, got {self.mttf_h!r}")
        if self.count < 1:
            raise ValueError(f"component {self.name!r}: count per node must be >= 1, got {self.count}")

    @property
    def rate_per_h(self) -> float:
        return self.count / self.mttf_h


def parse_component(text: str) -> Component:
    """`NAME:MTTF_HOURS:COUNT_PER_NODE`, e.g. `gpu:100000:8`."""
    match = _COMPONENT.match(text)
    if match is None:
        raise ValueError(f"--component {text!r} is not NAME:MTTF_HOURS:COUNT_PER_NODE (e.g. gpu:100000:8)")
    name, mttf, count = match.groups()
    try:
        mttf_h = float(mttf)
    except ValueError:
        raise ValueError(f"--component {text!r}: MTTF {mttf!r} is not a number of hours") from None
    if not count.isdigit():
        raise ValueError(f"--component {text!r}: count {count!r} is not a whole number")
    return Component(name, mttf_h, int(count))


# Per node (an 8-GPU server). Chosen so that 16,384 GPUs see a failure every ~3.3 h, which is
# Llama 3's 419 unexpected interruptions in 54 days (ANCHORS.md 3.5), split roughly as there:
# GPU (55 %), software (17 %), host (14 %), network (11 %), power (3 %).
DEFAULT_COMPONENTS: tuple[Component, ...] = (
    Component("gpu", 100_000.0, 8),
    Component("nic", 500_000.0, 8),
    Component("psu", 400_000.0, 2),
    Component("host", 50_000.0, 1),
    Component("software", 40_000.0, 1),
)


def _check(name: str, value: float, low: float, high: float, *, low_open: bool = False) -> None:
    is_ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not is_ok:
        bound = "(" if low_open else "["
        raise ValueError(f"{name} must be within {bound}{low:g}, {high:g}], got {value!r}")


@dataclass(frozen=True, slots=True)
class SimSpec:
    """Everything one simulated job needs. Times are seconds unless the name says otherwise."""

    gpus: int
    gpus_per_node: int = 8
    components: tuple[Component, ...] = DEFAULT_COMPONENTS
    job_days: float = 30.0
    step_s: float = 10.0
    # checkpoint_only: a synchronous checkpoint to storage pauses training this long.
    checkpoint_s: float = 60.0
    checkpoint_interval_h: float | None = None  # None: the Young/Daly interval
    detect_s: float = 300.0  # checkpoint_only: until the job notices (collective timeout, keep-alive)
    restart_s: float = 600.0  # restart every process, re-form the job, load the checkpoint
    # ftsup: the supervisor's detector (dead after interval x misses of silence).
    heartbeat_s: float = 1.0
    heartbeat_misses: int = 2
    snapshot_s: float = 0.2  # pause per RAM snapshot (device -> host copy; the buddy copy is async)
    snapshot_every_steps: int = 1
    warm_restart_s: float = 60.0  # re-form on a warm spare, restore from RAM (own or buddy's)
    ftsup_checkpoint_h: float = 6.0  # object-store fallback for a node lost with its buddy
    spares: int | None = None  # None: enough that the pool runs dry < 0.1 % of the time
    repair_h: float = 48.0  # a failed node returns to the spare pool this long after its death

    def __post_init__(self) -> None:
        if not 1 <= self.gpus_per_node <= 64:
            raise ValueError(f"--gpus-per-node must be within [1, 64], got {self.gpus_per_node}")
        if self.gpus < 1:
            raise ValueError(f"--gpus must be >= 1, got {self.gpus}")
        if self.gpus % self.gpus_per_node:
            raise ValueError(f"--gpus {self.gpus} is not divisible by --gpus-per-node {self.gpus_per_node}")
        if not 1 <= self.nodes <= 100_000:
            raise ValueError(f"the job must have 1..100000 nodes, got {self.nodes} ({self.gpus} GPUs)")
        if not self.components:
            raise ValueError("at least one --component is needed")
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise ValueError(f"component names must be unique, got {names}")
        _check("--job-days", self.job_days, 0, 3650, low_open=True)
        _check("--step-s", self.step_s, 0, 3600, low_open=True)
        _check("--checkpoint-s", self.checkpoint_s, 0, 86400)
        if self.checkpoint_interval_h is not None:
            _check("--checkpoint-interval-h", self.checkpoint_interval_h, 0, 87600, low_open=True)
        _check("--detect-s", self.detect_s, 0, 6000, low_open=True)
        _check("--restart-s", self.restart_s, 0, 86400)
        _check("--heartbeat-s", self.heartbeat_s, 0, 60, low_open=True)
        if not 1 <= self.heartbeat_misses <= 100:
            raise ValueError(f"--heartbeat-misses must be within [1, 100], got {self.heartbeat_misses}")
        _check("--snapshot-s", self.snapshot_s, 0, 3600)
        if not 1 <= self.snapshot_every_steps <= 1_000_000:
            raise ValueError(f"--snapshot-every must be within [1, 1000000], got {self.snapshot_every_steps}")
        _check("--warm-restart-s", self.warm_restart_s, 0, 86400)
        _check("--ftsup-checkpoint-h", self.ftsup_checkpoint_h, 0, 87600, low_open=True)
        if self.spares is not None and not 0 <= self.spares <= 100_000:
            raise ValueError(f"--spares must be within [0, 100000], got {self.spares}")
        _check("--repair-h", self.repair_h, 0, 87600, low_open=True)

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def node_rate_per_h(self) -> float:
        return sum(c.rate_per_h for c in self.components)

    @property
    def node_mtbf_h(self) -> float:
        return 1.0 / self.node_rate_per_h

    @property
    def fleet_mtbf_h(self) -> float:
        return self.node_mtbf_h / self.nodes

    @property
    def job_hours(self) -> float:
        return self.job_days * 24.0

    @property
    def expected_failures(self) -> float:
        """Over the job's duration of useful training (the wall time is longer; see each strategy)."""
        return self.job_hours / self.fleet_mtbf_h

    @property
    def young_daly_interval_h(self) -> float:
        return math.sqrt(2.0 * (self.checkpoint_s / HOUR_S) * self.fleet_mtbf_h)

    @property
    def daly_higher_order_interval_h(self) -> float:
        """Daly 2006 eq. 37: sqrt(2CM)[1 + sqrt(C/2M)/3 + (C/2M)/9] - C for C < 2M, else M."""
        c, m = self.checkpoint_s / HOUR_S, self.fleet_mtbf_h
        if c >= 2 * m:
            return m
        r = c / (2 * m)
        return math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c

    @property
    def checkpoint_interval_s(self) -> float:
        """checkpoint_only's work between checkpoints: the flag, else Young/Daly."""
        hours = self.checkpoint_interval_h if self.checkpoint_interval_h is not None else self.young_daly_interval_h
        return hours * HOUR_S

    @property
    def ftsup_detect_s(self) -> float:
        return self.heartbeat_s * self.heartbeat_misses

    @property
    def spare_count(self) -> int:
        if self.spares is not None:
            return self.spares
        in_repair = self.nodes * self.node_rate_per_h * self.repair_h
        return max(2, poisson_quantile(in_repair, 1e-3))


def poisson_quantile(mean: float, tail: float) -> int:
    """The smallest k with P(Poisson(mean) > k) < tail (terms summed in log space: no underflow)."""
    if mean <= 0:
        return 0
    k, log_term, cdf = 0, -mean, 0.0
    limit = mean + 50 * math.sqrt(mean) + 50
    while 1.0 - cdf >= tail and k <= limit:
        cdf += math.exp(log_term)
        if 1.0 - cdf < tail:
            break
        k += 1
        log_term += math.log(mean / k)
    return k


def expected_segment_s(x_s: float, recovery_s: float, mtbf_s: float) -> float:
    """Mean wall time to get x seconds of uninterrupted progress (Daly 2006, eq. 7)."""
    return mtbf_s * math.exp(recovery_s / mtbf_s) * math.expm1(x_s / mtbf_s)


@dataclass(frozen=True, slots=True)
class Analytic:
    ettr_expected: float  # the renewal model for exponential failures (what the simulator should match)
    ettr_first_order: float  # the textbook 1 - overhead - loss-per-failure / MTBF


def snapshot_cycle_s(spec: SimSpec) -> float:
    return spec.step_s * spec.snapshot_every_steps


def ftsup_snapshots_per_checkpoint(spec: SimSpec) -> int:
    return max(1, round(spec.ftsup_checkpoint_h * HOUR_S / snapshot_cycle_s(spec)))


def analytic(spec: SimSpec, strategy: str) -> Analytic:
    """Ignores: the job's last, partial interval; a node lost with its buddy (ftsup falls back to
    the object store); waiting for spares. The simulator includes all three."""
    m = spec.fleet_mtbf_h * HOUR_S
    if strategy == "checkpoint_only":
        tau, c, r = spec.checkpoint_interval_s, spec.checkpoint_s, spec.detect_s + spec.restart_s
        expected = tau / expected_segment_s(tau + c, r, m)
        first = 1 - c / tau - (tau / 2 + r) / m
        return Analytic(expected, first)
    if strategy == "ftsup":
        w, s, c = snapshot_cycle_s(spec), spec.snapshot_s, spec.checkpoint_s
        k = ftsup_snapshots_per_checkpoint(spec)
        r = spec.ftsup_detect_s + spec.warm_restart_s
        expected = k * w / (k * expected_segment_s(w + s, r, m) + expected_segment_s(c, r, m))
        first = 1 - s / w - c / (k * w) - ((w + s) / 2 + r) / m
        return Analytic(expected, first)
    raise ValueError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
