"""The supervisor's Prometheus metrics: what on-call graphs and alerts on, and the training signals.

Two kinds, costed differently. What *is* (nodes by state, term, leadership, the job's step, loss,
straggler scores, per-rank times) is read from the runtime's views at scrape time, so the input
loop pays nothing for it. What *happens* (inputs, refusals, appends and their latency, step
times, recoveries, detections, checkpoint durations) is counted by the runtime as it happens,
O(1) per input. Per-rank series are exported only up to `per_rank_limit` ranks: at 100k ranks
they would dwarf everything else a Prometheus server holds; the histograms cover the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ftsup.common.loop_metrics import LoopCollector
from ftsup.supervisor.core.events import (
    CheckpointCommitted,
    CheckpointStarted,
    GenerationEnded,
    GenerationRunning,
    NodeDeclaredDead,
    Record,
    SnapshotCommitted,
)
from ftsup.supervisor.core.inputs import HeardFrom, Heartbeat, Input, StepAggregate, StepReport
from ftsup.supervisor.server.log_digest import LogDigest

if TYPE_CHECKING:
    from ftsup.supervisor.runtime import Runtime

STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RECOVERY_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


@dataclass(frozen=True, slots=True)
class ThroughputConfig:
    """What turns tokens/s into MFU: the model's training FLOPs per token (≈ 6 × parameters for a
    dense transformer) and one rank's peak FLOP/s (e.g. 989e12 for an H100's dense BF16)."""

    flops_per_token: float = 0.0  # 0: MFU not exported
    peak_flops_per_rank: float = 0.0
    per_rank_limit: int = 1024

    def __post_init__(self) -> None:
        for name in ("flops_per_token", "peak_flops_per_rank"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.per_rank_limit < 0:
            raise ValueError(f"per_rank_limit must be >= 0, got {self.per_rank_limit}")


@dataclass(slots=True)
class _RankLatest:
    step: int
    step_time_s: float
    compute_time_s: float
    tokens: int


class SupervisorMetrics:
    """Owns one registry; the runtime calls `on_input` / `on_append` / `on_record`."""

    def __init__(self, throughput: ThroughputConfig | None = None) -> None:
        self.throughput = throughput or ThroughputConfig()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.inputs = Counter("ftsup_inputs", "Inputs handled by the decision loop", ["kind"], registry=r)
        self.refused = Counter("ftsup_inputs_refused", "Inputs refused (malformed, stale, unknown sender)",
                               ["kind"], registry=r)
        self.heartbeats = Counter("ftsup_heartbeats", "Heartbeats received from agents", registry=r)
        self.events = Counter("ftsup_events_appended", "Events appended to the event log", ["kind"], registry=r)
        self.append_seconds = Histogram("ftsup_event_append_seconds", "Latency of one durable append",
                                        buckets=APPEND_BUCKETS, registry=r)
        self.step_seconds = Histogram("ftsup_step_seconds", "Training step wall time, every rank",
                                      buckets=STEP_BUCKETS, registry=r)
        self.compute_seconds = Histogram("ftsup_compute_seconds", "Time to gradients ready, every rank",
                                         buckets=STEP_BUCKETS, registry=r)
        self.recovery_seconds = Histogram("ftsup_recovery_seconds",
                                          "A generation's end to its successor's first step",
                                          buckets=RECOVERY_BUCKETS, registry=r)
        self.detection_seconds = Histogram("ftsup_detection_seconds",
                                           "Silence of a node when it was declared dead",
                                           buckets=RECOVERY_BUCKETS, registry=r)
        self.checkpoint_seconds = Histogram("ftsup_checkpoint_seconds", "Checkpoint start to commit",
                                            buckets=RECOVERY_BUCKETS, registry=r)
        self.snapshots = Counter("ftsup_snapshots_committed", "In-memory snapshot steps committed", registry=r)
        self._ranks: dict[int, _RankLatest] = {}
        self._loss = math.nan
        self._grad_norm = math.nan
        self._generation_ended_at: float | None = None
        self._checkpoint_started_at: dict[str, float] = {}
        self._runtime: Runtime | None = None
        self.goodput = LogDigest()  # read from the log at scrape time: history survives a restart

    def attach(self, runtime: Runtime) -> None:
        """Registers the scrape-time collector over `runtime`'s views."""
        self._runtime = runtime
        self.registry.register(_StateCollector(runtime, self))
        self.registry.register(LoopCollector())

    async def refresh(self) -> None:
        """Before a scrape: fold event-log records appended since the last one into goodput."""
        if self._runtime is not None:
            await self.goodput.catch_up(self._runtime.event_log)

    # -- called by the runtime, O(1) each ------------------------------------------------------
    def on_input(self, inp: Input, refusal: str | None) -> None:
        kind = type(inp).__name__
        if refusal is not None:
            self.refused.labels(kind).inc()
            return
        self.inputs.labels(kind).inc()
        if isinstance(inp, Heartbeat):
            self.heartbeats.inc()
        elif isinstance(inp, HeardFrom):
            self.heartbeats.inc(len(inp.node_ids))  # (each node named was heard at least once)
        elif isinstance(inp, StepReport):
            self._on_step_report(inp)
        elif isinstance(inp, StepAggregate):
            self._on_step_aggregate(inp)

    def _on_step_aggregate(self, inp: StepAggregate) -> None:
        """A node's ranks' figures, straight from the aggregate's arrays (no report per rank)."""
        step_times, compute_times = inp.step_time_s.tolist(), inp.compute_time_s.tolist()
        for value in step_times:
            self.step_seconds.observe(value)
        for value in compute_times:
            self.compute_seconds.observe(value)
        for rank, step_s, compute_s, tokens in zip(inp.ranks.tolist(), step_times, compute_times, inp.tokens.tolist()):
            latest = self._ranks.get(rank)
            if latest is None or inp.step >= latest.step:
                self._ranks[rank] = _RankLatest(inp.step, step_s, compute_s, tokens)
        zero = np.flatnonzero(inp.ranks == 0)
        if len(zero):
            self._loss, self._grad_norm = float(inp.loss[zero[0]]), float(inp.grad_norm[zero[0]])

    def _on_step_report(self, inp: StepReport) -> None:
        self.step_seconds.observe(inp.step_time_s)
        self.compute_seconds.observe(inp.compute_time_s)
        latest = self._ranks.get(inp.rank)
        if latest is None or inp.step >= latest.step:
            self._ranks[inp.rank] = _RankLatest(inp.step, inp.step_time_s, inp.compute_time_s, inp.tokens)
        if inp.rank == 0:
            self._loss, self._grad_norm = inp.loss, inp.grad_norm

    def on_append(self, seconds: float) -> None:
        self.append_seconds.observe(seconds)

    def on_record(self, record: Record) -> None:
        event = record.event
        self.events.labels(type(event).__name__).inc()
        match event:
            case NodeDeclaredDead():
                self.detection_seconds.observe(max(0.0, event.silent_for_s))
            case GenerationEnded():
                self._generation_ended_at = record.time_unix_s
                self._ranks.clear()  # a new world may number its ranks differently
            case GenerationRunning():
                if self._generation_ended_at is not None:
                    self.recovery_seconds.observe(max(0.0, record.time_unix_s - self._generation_ended_at))
                    self._generation_ended_at = None
            case SnapshotCommitted():
                self.snapshots.inc()
            case CheckpointStarted():
                self._checkpoint_started_at[event.checkpoint_id] = record.time_unix_s
            case CheckpointCommitted():
                started = self._checkpoint_started_at.pop(event.checkpoint_id, None)
                if started is not None:
                    self.checkpoint_seconds.observe(max(0.0, record.time_unix_s - started))

    # -- derived, at scrape time ---------------------------------------------------------------
    def tokens_per_s(self) -> float:
        """Σ over ranks of tokens / step time: ranks step in lock-step, so this is the job's rate."""
        rates = [r.tokens / r.step_time_s for r in self._ranks.values() if r.tokens and r.step_time_s > 0]
        return sum(rates) if rates else math.nan

    def mfu(self, world_size: int) -> float:
        t = self.throughput
        if not (t.flops_per_token and t.peak_flops_per_rank and world_size):
            return math.nan
        return self.tokens_per_s() * t.flops_per_token / (t.peak_flops_per_rank * world_size)


class _StateCollector(Collector):
    def __init__(self, runtime: Runtime, metrics: SupervisorMetrics) -> None:
        self._runtime = runtime
        self._metrics = metrics

    def describe(self) -> Sequence[Metric]:
        return []  # computed at collect time; no fixed description

    def collect(self) -> Iterator[Metric]:
        runtime, metrics = self._runtime, self._metrics
        yield _gauge("ftsup_is_leader", "1 on the replica that decides", float(runtime.is_leader))
        yield _gauge("ftsup_leader_term", "This replica's term (the leader key's create revision)", runtime.term)
        yield _gauge("ftsup_degraded", "1 while the event log cannot be written (nothing is decided)",
                     float(bool(runtime.degraded_reason)))
        yield _gauge("ftsup_event_log_head_seq", "Last applied record", runtime.state.applied_seq)
        status = runtime.status()
        yield _gauge("ftsup_job_generation", "Current generation", status.generation)
        yield _gauge("ftsup_job_step", "Newest step reported", status.step)
        yield _gauge("ftsup_job_world_size", "Ranks in the job", status.world_size)
        yield _gauge("ftsup_job_last_snapshot_step", "Newest committed in-memory snapshot step",
                     status.last_snapshot_step if status.last_snapshot_step is not None else math.nan)
        yield _gauge("ftsup_loss", "Loss reported by rank 0", metrics._loss)
        yield _gauge("ftsup_grad_norm", "Gradient norm reported by rank 0", metrics._grad_norm)
        yield _gauge("ftsup_tokens_per_second", "Training throughput", metrics.tokens_per_s())
        yield _gauge("ftsup_mfu", "Model FLOPs utilisation (needs --flops-per-token, --peak-flops-per-rank)",
                     metrics.mfu(status.world_size))
        report = metrics.goodput.goodput(runtime.wall_now())
        yield _gauge("ftsup_goodput_ettr", "Effective training time ratio: productive / wall time",
                     report.ettr if report.ettr is not None else math.nan)
        buckets = GaugeMetricFamily("ftsup_goodput_seconds", "Wall time by where it went", labels=["bucket"])
        for bucket in ("productive", "detection", "restart", "lost_work", "waiting"):
            buckets.add_metric([bucket], getattr(report, f"{bucket}_s"))
        yield buckets
        yield _gauge("ftsup_goodput_lost_steps", "Steps redone after restores", report.lost_steps)
        nodes = runtime.nodes()
        by_state = GaugeMetricFamily("ftsup_nodes", "Nodes by liveness and role", labels=["state", "role"])
        counts: dict[tuple[str, str], int] = {}
        for node in nodes:
            state = "quarantined" if node.is_quarantined else node.liveness.name.lower()
            key = (state, node.role.name.lower())
            counts[key] = counts.get(key, 0) + 1
        for (state, role), count in sorted(counts.items()):
            by_state.add_metric([state, role], count)
        yield by_state
        xids = GaugeMetricFamily("ftsup_node_xids", "Xid errors reported by a node", labels=["node"])
        straggler = GaugeMetricFamily("ftsup_node_straggler_score", "Last straggler score", labels=["node"])
        age = GaugeMetricFamily("ftsup_node_heartbeat_age_seconds", "Since the node was last heard",
                                labels=["node"])
        for node in nodes:
            xids.add_metric([node.node_id], node.xid_count)
            straggler.add_metric([node.node_id], node.straggler_score)
            if node.last_heartbeat_age_s >= 0:
                age.add_metric([node.node_id], node.last_heartbeat_age_s)
        yield from (xids, straggler, age)
        ranks = metrics._ranks
        if len(ranks) <= metrics.throughput.per_rank_limit:
            step = GaugeMetricFamily("ftsup_rank_step_seconds", "Latest step time per rank", labels=["rank"])
            compute = GaugeMetricFamily("ftsup_rank_compute_seconds", "Latest compute time per rank",
                                        labels=["rank"])
            for rank in sorted(ranks):
                step.add_metric([str(rank)], ranks[rank].step_time_s)
                compute.add_metric([str(rank)], ranks[rank].compute_time_s)
            yield from (step, compute)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
