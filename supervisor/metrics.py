"""The supervisor's Prometheus metrics: what on-call graphs and alerts on, and the training signals.

Two kinds, costed differently. What *is* (nodes by state, term, leadership, the job's step, loss,
straggler scores, per-rank times) is read from the runtime's views at scrape time, so the input
loop pays nothing for it. What *happens* (inputs, refusals, appends and their latency, step
times, recoveries, detections, checkpoint durations) is counted by the runtime as it happens,
O(1) per input; a step's per-rank figures are kept as their aggregates arrive and folded as
arrays in batches (metrics_arrays.py: one node-step cost ~50 µs of the loop as single
observations, as much as the core's decision on it). Per-rank series are exported only up to
`per_rank_limit` ranks: at 100k ranks they would dwarf everything else a Prometheus server
holds; the histograms cover the fleet.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from ftsup.supervisor.metrics_arrays import ArrayHistogram, LatestByRank
from ftsup.supervisor.server.log_digest import LogDigest

if TYPE_CHECKING:
    from ftsup.supervisor.core.views import NodeFigures
    from ftsup.supervisor.runtime import Runtime

# Ranks' step figures kept before they are folded (a few MB at most: views of the aggregates'
# arrays; an aggregate is one node's ranks, or a shard's fold of forty nodes').
PENDING_RANKS = 32_768
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RECOVERY_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
# (a summary gathers up to 0.1 s, shard.py SUMMARY_GATHER_S; the detector suspects after 1.5 intervals)
SHARD_LIVENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)
GC_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


@dataclass(frozen=True, slots=True)
class ThroughputConfig:
    """What turns tokens/s into MFU: the model's training FLOPs per token (≈ 6 × parameters for a
    dense transformer) and one rank's peak FLOP/s (e.g. 989e12 for an H100's dense BF16); and how
    many per-rank and per-node series a scrape carries at most."""

    flops_per_token: float = 0.0  # 0: MFU not exported
    peak_flops_per_rank: float = 0.0
    per_rank_limit: int = 1024
    per_node_limit: int = 1024

    def __post_init__(self) -> None:
        for name in ("flops_per_token", "peak_flops_per_rank"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("per_rank_limit", "per_node_limit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


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
        # (fed many nodes' ranks at once: metrics_arrays.py)
        self._pending: list[StepAggregate] = []  # step figures not yet folded (see flush)
        self._pending_ranks = 0
        self.step_seconds = ArrayHistogram("ftsup_step_seconds", "Training step wall time, every rank", STEP_BUCKETS,
                                           before_collect=self.flush)
        self.compute_seconds = ArrayHistogram("ftsup_compute_seconds", "Time to gradients ready, every rank",
                                              STEP_BUCKETS, before_collect=self.flush)
        r.register(self.step_seconds)
        r.register(self.compute_seconds)
        self.recovery_seconds = Histogram("ftsup_recovery_seconds",
                                          "A generation's end to its successor's first step",
                                          buckets=RECOVERY_BUCKETS, registry=r)
        self.detection_seconds = Histogram("ftsup_detection_seconds",
                                           "Silence of a node when it was declared dead",
                                           buckets=RECOVERY_BUCKETS, registry=r)
        self.checkpoint_seconds = Histogram("ftsup_checkpoint_seconds", "Checkpoint start to commit",
                                            buckets=RECOVERY_BUCKETS, registry=r)
        # On a follower replica (a link shard): how long the news of its nodes' heartbeats took to be
        # admitted by the leader, from the first heartbeat a liveness summary names being read on
        # the shard to the leader's answer (supervisor/shard_queue.py HeardSince). Nothing on the leader.
        self.shard_liveness_seconds = Histogram(
            "ftsup_shard_liveness_admitted_seconds",
            "On a link shard: a liveness summary's oldest heartbeat read to the leader's admission of it",
            buckets=SHARD_LIVENESS_BUCKETS, registry=r)
        # Every replica's ticker (0.1 s): how late its event loop woke it. On the leader a stall is
        # forgiven to every node's silence; on a follower it is its link shard's loop, whose agents'
        # streams were not read meanwhile.
        self.loop_late_seconds = Histogram("ftsup_loop_late_seconds",
                                           "How late this replica's event loop woke its 0.1 s ticker",
                                           buckets=SHARD_LIVENESS_BUCKETS, registry=r)
        # This process's garbage collections, by generation (common/gc_pacing.py: a full one walks the
        # heap not frozen since the last, and pauses every task of the loop meanwhile)
        self.gc_pause_seconds = Histogram("ftsup_gc_pause_seconds", "Garbage collection pauses of this process",
                                          ["generation"], buckets=GC_BUCKETS, registry=r)
        self.snapshots = Counter("ftsup_snapshots_committed", "In-memory snapshot steps committed", registry=r)
        self.step_folds = Counter("ftsup_step_folds", "Runs of nodes' step aggregates decided as one fold",
                                  registry=r)
        self.step_folded = Counter("ftsup_step_aggregates_folded", "Step aggregates decided inside a fold",
                                   registry=r)
        self._ranks = LatestByRank()
        self._input_counters: dict[str, Any] = {}
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

    # -- called by the runtime, O(1) each (a batch fold every PENDING_RANKS) ---------------------
    def on_input(self, inp: Input, refusal: str | None) -> None:
        kind = type(inp).__name__
        if refusal is not None:
            self.refused.labels(kind).inc()
            return
        self._counter(kind).inc()
        self._on_figures(inp)

    def on_admitted(self, inputs: Sequence[Input]) -> None:
        """Admitted inputs (a fold's parts, issue 14): what `on_input` counts of each, with one
        increment of their kind's counter instead of one per part."""
        kinds = {type(inp).__name__ for inp in inputs}
        if len(kinds) != 1:
            for inp in inputs:
                self.on_input(inp, None)
            return
        self.on_admitted_count(kinds.pop(), len(inputs))
        for inp in inputs:
            self._on_figures(inp)

    def on_admitted_fold(self, fold: StepAggregate, parts: int) -> None:
        """A shard's fold of `parts` nodes' aggregates, all admitted: counted as its parts, its
        figures kept once (the fold's arrays are its parts' in order, which is all `flush` reads)."""
        self._counter("StepAggregate").inc(parts)
        self._on_step_aggregate(fold)

    def on_admitted_count(self, kind: str, count: int) -> None:
        """`count` admitted inputs of `kind` with no figures of their own (a holdings fold's parts)."""
        self._counter(kind).inc(count)

    def _counter(self, kind: str) -> Any:
        counter = self._input_counters.get(kind)
        if counter is None:  # (a child per kind, looked up once: `labels` costs microseconds)
            counter = self._input_counters[kind] = self.inputs.labels(kind)
        return counter

    def _on_figures(self, inp: Input) -> None:
        if isinstance(inp, Heartbeat):
            self.heartbeats.inc()
        elif isinstance(inp, HeardFrom):
            self.heartbeats.inc(len(inp.node_ids))  # (each node named was heard at least once)
        elif isinstance(inp, StepReport):
            self._on_step_aggregate(StepAggregate.of_reports((inp,)))  # (one path for both)
        elif isinstance(inp, StepAggregate):
            self._on_step_aggregate(inp)

    def _on_step_aggregate(self, inp: StepAggregate) -> None:
        """A node's ranks' figures: kept (the aggregate's own arrays) and folded in batches."""
        self._pending.append(inp)
        self._pending_ranks += len(inp)
        if self._pending_ranks >= PENDING_RANKS:
            self.flush()

    def flush(self) -> None:
        """Folds the step figures kept since the last flush: the histograms, each rank's latest,
        rank 0's loss. Called before anything reads them (a scrape, `tokens_per_s`) and every
        PENDING_RANKS ranks' figures (bounded memory)."""
        pending, self._pending, self._pending_ranks = self._pending, [], 0
        if not pending:
            return
        ranks = np.concatenate([a.ranks for a in pending])
        step_times = np.concatenate([a.step_time_s for a in pending])
        compute_times = np.concatenate([a.compute_time_s for a in pending])
        self.step_seconds.observe_many(step_times)
        self.compute_seconds.observe_many(compute_times)
        steps = np.repeat(np.array([a.step for a in pending], dtype=np.int64), [len(a) for a in pending])
        self._ranks.update(ranks, steps, step_times, compute_times, np.concatenate([a.tokens for a in pending]))
        zero = np.flatnonzero(ranks == 0)
        if len(zero):  # (the newest report of rank 0, in arrival order)
            at = int(zero[-1])
            self._loss = float(np.concatenate([a.loss for a in pending])[at])
            self._grad_norm = float(np.concatenate([a.grad_norm for a in pending])[at])

    def on_fold(self, parts: int) -> None:
        """A run of `parts` nodes' step aggregates was decided as one (runtime._handle_fold)."""
        self.step_folds.inc()
        self.step_folded.inc(parts)

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
                self.flush()  # (its steps still count in the histograms)
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
        self.flush()
        return self._ranks.tokens_per_s()

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
        metrics.flush()
        yield _gauge("ftsup_is_leader", "1 on the replica that decides", float(runtime.is_leader))
        yield _gauge("ftsup_leader_term", "This replica's term (the leader key's create revision)", runtime.term)
        yield _gauge("ftsup_degraded", "1 while the event log cannot be written (nothing is decided)",
                     float(bool(runtime.degraded_reason)))
        yield _gauge("ftsup_event_log_head_seq", "Last applied record", runtime.state.applied_seq)
        yield _gauge("ftsup_directives_owed", "Nodes a push in slices has yet to direct (a generation's start)",
                     runtime.directives_owed)
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
        figures = runtime.node_figures()
        by_state = GaugeMetricFamily("ftsup_nodes", "Nodes by liveness and role", labels=["state", "role"])
        for (state, role), count in sorted(figures.by_state.items()):
            by_state.add_metric([state, role], count)
        yield by_state
        yield from _per_node(figures, metrics.throughput.per_node_limit)
        latest = metrics._ranks
        known = latest.known()
        if len(known) <= metrics.throughput.per_rank_limit:
            step = GaugeMetricFamily("ftsup_rank_step_seconds", "Latest step time per rank", labels=["rank"])
            compute = GaugeMetricFamily("ftsup_rank_compute_seconds", "Latest compute time per rank",
                                        labels=["rank"])
            for rank, step_s, compute_s in zip(known.tolist(), latest.step_time_s[known].tolist(),
                                               latest.compute_time_s[known].tolist()):
                step.add_metric([str(rank)], step_s)
                compute.add_metric([str(rank)], compute_s)
            yield from (step, compute)


def _per_node(figures: NodeFigures, limit: int) -> Iterator[Metric]:
    """The per-node gauges: every node's up to `limit` nodes; past it, each gauge's worst `limit`
    (the most Xids, the highest straggler scores, the oldest heartbeats; a node with no Xid or no
    score is not news), so a 12,500-node fleet's scrape is not 37,500 series whose exposition
    stalls the leader's loop for half a second (`ftsup bench metrics-scrape`). The fleet's shape
    is in `ftsup_nodes` and the heartbeat-age maximum."""
    ids, xid_counts, scores, ages = (figures.node_ids, figures.xid_counts, figures.straggler_scores,
                                     figures.heartbeat_ages_s)
    heard = [i for i, age in enumerate(ages) if age >= 0]
    yield _gauge("ftsup_node_heartbeat_age_max_seconds", "The longest any node has not been heard",
                 max((ages[i] for i in heard), default=math.nan))
    whole = len(ids) <= limit
    yield _gauge("ftsup_node_series_limited", f"1 while per-node series show only the worst {limit} nodes"
                 " (--metrics-per-node-limit)", float(not whole))
    everyone = range(len(ids))
    listed = {
        "xids": everyone if whole else heapq.nlargest(limit, (i for i in everyone if xid_counts[i] > 0),
                                                      key=xid_counts.__getitem__),
        "straggler": everyone if whole else heapq.nlargest(limit, (i for i in everyone if scores[i] > 0),
                                                           key=scores.__getitem__),
        "age": heard if whole else heapq.nlargest(limit, heard, key=ages.__getitem__),
    }
    xids = GaugeMetricFamily("ftsup_node_xids", "Xid errors reported by a node", labels=["node"])
    for i in listed["xids"]:
        xids.add_metric([ids[i]], xid_counts[i])
    straggler = GaugeMetricFamily("ftsup_node_straggler_score", "Last straggler score", labels=["node"])
    for i in listed["straggler"]:
        straggler.add_metric([ids[i]], scores[i])
    age = GaugeMetricFamily("ftsup_node_heartbeat_age_seconds", "Since the node was last heard", labels=["node"])
    for i in listed["age"]:
        age.add_metric([ids[i]], ages[i])
    yield from (xids, straggler, age)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
