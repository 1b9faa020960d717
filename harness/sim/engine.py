"""One simulated job, start to finish, in virtual time: failures in, the core's decisions out,
every second of wall time put in one bucket.

Failures strike the job's gang as a Poisson process at the fleet rate (exponential node lives, so
the next failure is one draw from a seeded `random.Random`, the victim a uniform pick). The core
decides when a failure is detected (its detector's deadline), whether a spare can stand in (or
the job waits for a repaired node), and where the ranks restore from: RAM snapshots (the ladder)
or nothing, in which case the job reloads its newest checkpoint. The simulator adds what the
core leaves to the shells: how long a restart takes and how much work is redone.

Buckets: useful work, checkpoint pauses, snapshot pauses, detection (failure to verdict, and any
wait for another suspect's verdict), waiting for spares, restart (plan to first step) and lost
work (steps computed and then redone). They sum to the wall time; `simulate` checks that.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from operator import attrgetter

from ftsup.harness.sim.fleet import CoreDriver, Fleet
from ftsup.harness.sim.model import HOUR_S, SimSpec, analytic, ftsup_snapshots_per_checkpoint, snapshot_cycle_s
from ftsup.harness.sim.schedule import Schedule, Walk, walk
from ftsup.supervisor.core.config import DetectorConfig
from ftsup.supervisor.core.events import (
    Event,
    GenerationRunning,
    GenerationStarted,
    NodeDeclaredDead,
    RankRestore,
    RestoreKind,
)

BUCKETS = ("useful", "checkpoint_pauses", "snapshot_pauses", "detection", "waiting_for_spares", "restart", "lost_work")
MIN_EXPECTED_ETTR = 0.01  # below this (per the renewal model) a job is reported, not simulated
MAX_WALL_FACTOR = 200.0  # the safety net: a run this many times slower than its work stops


class NoProgress(RuntimeError):
    """The job cannot finish: failures come faster than it can recover and make progress."""


@dataclass(frozen=True, slots=True)
class RunResult:
    strategy: str
    wall_s: float
    seconds: tuple[tuple[str, float], ...]  # (bucket, seconds), in BUCKETS order
    failures: int
    generations: int  # generations the core started after the first
    restores_from_ram: int
    restores_from_checkpoint: int
    waits_for_spares: int

    @property
    def ettr(self) -> float:
        return dict(self.seconds)["useful"] / self.wall_s


def schedule_for(spec: SimSpec, strategy: str) -> Schedule:
    work = spec.job_days * 86400.0
    if strategy == "checkpoint_only":
        return Schedule(work, spec.checkpoint_interval_s, 0.0, 1, spec.checkpoint_s)
    return Schedule(work, snapshot_cycle_s(spec), spec.snapshot_s, ftsup_snapshots_per_checkpoint(spec), spec.checkpoint_s)


def detector_for(spec: SimSpec, strategy: str) -> DetectorConfig:
    if strategy == "checkpoint_only":
        # The job notices a dead node `detect_s` after it died (the core's detector set to that).
        misses = max(2, math.ceil(spec.detect_s / 60.0))
        return DetectorConfig(heartbeat_interval_s=spec.detect_s / misses, heartbeat_misses=misses)
    return DetectorConfig(heartbeat_interval_s=spec.heartbeat_s, heartbeat_misses=spec.heartbeat_misses)


_DEADLINE, _REPAIR, _READY = "deadline", "repair", "ready"


def _is_from_ram(step: int | None, restores: tuple[RankRestore, ...]) -> bool:
    """The core restores every rank from RAM (its own node's or a peer's), not from storage."""
    if step is None:
        return False
    kinds = list(map(attrgetter("kind"), restores))  # (12,500 at 100k GPUs; counted in C)
    return kinds.count(RestoreKind.LOCAL_SNAPSHOT) + kinds.count(RestoreKind.PEER_SNAPSHOT) == len(kinds)


class _Run:
    """The mutable bookkeeping of one run; `simulate` is its only user."""

    def __init__(self, spec: SimSpec, strategy: str, fleet: Fleet, seed: int) -> None:
        self.spec, self.strategy = spec, strategy
        self.rng = random.Random(seed)
        self.schedule = schedule_for(spec, strategy)
        self.core = CoreDriver(fleet.job, detector_for(spec, strategy), fleet.state)
        self.rate_per_s = spec.nodes / (spec.node_mtbf_h * HOUR_S)
        self.seconds = dict.fromkeys(BUCKETS, 0.0)
        self.heap: list[tuple[float, int, str, str | int]] = []  # (when, order, kind, node id or generation)
        self.pushed = 0
        self.failures = self.generations = self.from_ram = self.from_checkpoint = self.waits = 0
        self.gang: tuple[str, ...] = ()
        self.is_warm = False  # the generation in force restores every rank from RAM (ftsup)
        self.down: set[str] = set()  # failed and not yet repaired
        # training: a stretch starts at `start_t` from boundary `start_p`
        self.is_training = False
        self.start_t = self.start_p = self.checkpoint_p = self.reached = 0.0
        self.is_checkpoint_due = False
        # recovery: time since `since_t` goes to bucket `phase`
        self.phase, self.since_t = "detection", 0.0

    def push(self, when: float, kind: str, payload: str | int) -> None:
        self.pushed += 1
        heapq.heappush(self.heap, (when, self.pushed, kind, payload))

    def account(self, now: float, next_phase: str) -> None:
        self.seconds[self.phase] += now - self.since_t
        self.phase, self.since_t = next_phase, now

    def on_plan(self, events: tuple[Event, ...], now: float) -> None:
        """After a verdict or a returning node: a new generation starts restarting, or the job waits."""
        started = [e for e in events if isinstance(e, GenerationStarted)]
        if started:
            generation = started[-1]
            self.generations += 1
            self.gang = tuple(map(attrgetter("node_id"), generation.members))
            self.is_warm = self.strategy == "ftsup" and _is_from_ram(generation.restore_step, generation.restores)
            self.account(now, "restart")
            self.push(now + (self.spec.warm_restart_s if self.is_warm else self.spec.restart_s), _READY,
                      generation.generation)
        elif self.core.state.generation is None:
            is_short = self.core.waiting_reason.startswith("need ")
            if is_short and self.phase != "waiting_for_spares":
                self.waits += 1
            self.account(now, "waiting_for_spares" if is_short else "detection")

    def on_failure(self, now: float) -> None:
        # Draws come at the rate of a whole gang; one that lands on a node already down is no
        # failure (thinning: each node that is up fails at the node rate, a down one cannot).
        victim = self.gang[self.rng.randrange(len(self.gang))]
        if victim in self.down:
            return
        self.failures += 1
        if self.is_training:
            done = walk(self.schedule, self.start_p, self.checkpoint_p, self.is_checkpoint_due, now - self.start_t)
            self.seconds["snapshot_pauses"] += done.snapshot_pause_s
            self.seconds["checkpoint_pauses"] += done.checkpoint_pause_s
            self.reached, self.checkpoint_p = done.reached_s, done.checkpoint_s
            self.is_training = False
            self.phase, self.since_t = "detection", now
            if self.strategy == "ftsup":
                self.commit_snapshot(done.snapshot_s, now)
        else:
            self.account(now, "detection")
        self.down.add(victim)
        self.push(self.core.fail(victim, now), _DEADLINE, victim)

    def commit_snapshot(self, progress_s: float, now: float) -> None:
        step = round(progress_s / self.spec.step_s)
        committed = self.core.state.snapshot
        if step > (committed.step if committed is not None else 0):
            self.core.commit_snapshot(step, now, self.spec.step_s)

    def on_deadline(self, victim: str, now: float) -> None:
        events = self.core.tick(now)
        if not any(isinstance(e, NodeDeclaredDead) and e.node_id == victim for e in events):
            raise RuntimeError(f"the core did not declare {victim} dead at its deadline t={now}: {events}")
        self.core.silent.discard(victim)
        self.push(now + self.spec.repair_h * HOUR_S, _REPAIR, victim)
        self.on_plan(events, now)

    def on_repair(self, node_id: str, now: float) -> None:
        self.down.discard(node_id)
        events = self.core.repair(node_id, now)
        if not self.is_training:
            self.on_plan(events, now)

    def on_ready(self, generation: int, now: float) -> None:
        current = self.core.state.generation
        if self.is_training or current is None or current.number != generation:
            return  # a restart overtaken by another failure
        if any(current.member(node_id) for node_id in self.core.silent):
            return  # a member died during the restart: its verdict will end this generation
        self.account(now, "detection")
        if self.is_warm and current.restore_step is not None:  # warm implies a step (_is_from_ram)
            # The core may name a snapshot newer than the work just reached (one committed before
            # a fall back to a checkpoint): the trainer loads it, bit-identical, and is ahead again.
            restore = current.restore_step * self.spec.step_s
            self.from_ram += 1
            self.is_checkpoint_due = self.schedule.is_checkpoint_boundary(restore) and self.checkpoint_p < restore
        else:
            restore = self.checkpoint_p
            self.from_checkpoint += 1
            self.is_checkpoint_due = False
        self.seconds["lost_work"] += self.reached - restore
        events = self.core.start_running(now, self.spec.step_s)
        if not any(isinstance(e, GenerationRunning) for e in events):
            raise RuntimeError(f"generation {generation} did not start running: {events}")
        self.is_training, self.start_t, self.start_p, self.reached = True, now, restore, restore

    def run(self) -> RunResult:
        spec = self.spec
        first = self.core.state.generation
        assert first is not None
        self.gang = tuple(map(attrgetter("node_id"), first.members))
        self.core.start_running(0.0, spec.step_s)
        self.is_training = True
        next_failure = self.rng.expovariate(self.rate_per_s)
        limit = MAX_WALL_FACTOR * self.schedule.work_s
        finish: Walk | None = None  # the current stretch's end, were no failure to come
        while True:
            if self.is_training:
                if finish is None:
                    finish = walk(self.schedule, self.start_p, self.checkpoint_p, self.is_checkpoint_due, math.inf)
                end = self.start_t + finish.used_s
                if end <= next_failure and (not self.heap or end <= self.heap[0][0]):
                    self.seconds["snapshot_pauses"] += finish.snapshot_pause_s
                    self.seconds["checkpoint_pauses"] += finish.checkpoint_pause_s
                    self.seconds["useful"] = self.schedule.work_s
                    return self.result(end)
            if self.heap and self.heap[0][0] < next_failure:
                now, _, kind, payload = heapq.heappop(self.heap)
                if kind == _DEADLINE:
                    self.on_deadline(str(payload), now)
                elif kind == _REPAIR:
                    self.on_repair(str(payload), now)
                else:
                    self.on_ready(int(payload), now)
            else:
                now = next_failure
                if now > limit:
                    raise NoProgress(
                        f"{self.strategy}: after {now / HOUR_S:,.0f} h of wall time the job is still not done"
                        f" ({self.failures} failures); restarts take too long for a fleet MTBF of"
                        f" {spec.fleet_mtbf_h * 60:.1f} min"
                    )
                self.on_failure(now)
                finish = None
                next_failure = now + self.rng.expovariate(self.rate_per_s)

    def result(self, wall_s: float) -> RunResult:
        total = sum(self.seconds.values())
        if abs(total - wall_s) > 1e-6 * wall_s + 1e-6:
            raise AssertionError(f"buckets sum to {total} s but the wall time is {wall_s} s: {self.seconds}")
        return RunResult(self.strategy, wall_s, tuple(self.seconds.items()), self.failures, self.generations,
                         self.from_ram, self.from_checkpoint, self.waits)


def simulate(spec: SimSpec, strategy: str, fleet: Fleet, seed: int) -> RunResult:
    """One replication; the same `seed` gives the same result."""
    expected = analytic(spec, strategy).ettr_expected
    if expected < MIN_EXPECTED_ETTR:
        raise NoProgress(
            f"{strategy}: the renewal model expects an ETTR of {expected:.2g}: recovery is too slow for a fleet"
            f" MTBF of {spec.fleet_mtbf_h * 60:.1f} min (not simulated)"
        )
    return _Run(spec, strategy, fleet, seed).run()
