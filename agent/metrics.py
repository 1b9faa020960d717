"""The agent's Prometheus metrics: what a node holds and how its ranks progress, read at scrape time.

Everything here is a view of state the agent keeps anyway (the snapshot store, the launcher,
the per-rank progress tracker, the report queue), so the agent pays nothing between scrapes.
The fleet-wide picture (loss, tokens/s, MFU, recoveries) is the supervisor's; a node's page
answers "what is this node doing right now" when one node looks wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ftsup.agent.link import Reports
from ftsup.agent.progress import ProgressTracker
from ftsup.agent.snapshots import SnapshotStore
from ftsup.common.loop_metrics import LoopCollector

Running = Callable[[], tuple[int, tuple[int, ...], set[int]]]  # Launcher.running
WarmIdle = Callable[[], int]  # WarmPoolRunner.idle: warm processes ready now


class AgentCollector(Collector):
    def __init__(self, node_id: str, store: SnapshotStore, running: Running, progress: ProgressTracker,
                 reports: Reports, warm_idle: WarmIdle | None = None) -> None:
        self._node_id = node_id
        self._store = store
        self._running = running
        self._progress = progress
        self._reports = reports
        self._warm_idle = warm_idle

    def describe(self) -> Sequence[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        node = [self._node_id]
        generation, ranks, alive = self._running()
        yield _gauge("ftsup_agent_generation", "Generation whose trainers run here (0: none)", node, generation)
        yield _gauge("ftsup_agent_ranks_assigned", "Ranks assigned to this node", node, len(ranks))
        yield _gauge("ftsup_agent_trainers_alive", "Trainer processes alive", node, len(alive))
        yield _gauge("ftsup_agent_snapshot_bytes", "Snapshot bytes held in RAM (own ranks and buddies')",
                     node, self._store.bytes_held)
        yield _gauge("ftsup_agent_snapshots", "Snapshots held in RAM", node, len(self._store))
        yield _gauge("ftsup_agent_snapshot_incoming_bytes", "Snapshot bytes reserved by streams still arriving",
                     node, self._store.bytes_incoming)
        yield _gauge("ftsup_agent_snapshot_spare_bytes",
                     "Receive buffers of dropped snapshots kept for the next ones (within the limit)",
                     node, self._store.bytes_spare)
        yield _gauge("ftsup_agent_snapshot_buffers_reused", "Snapshots received into a kept buffer (since start)",
                     node, self._store.buffers_reused)
        budget = self._store.budget
        yield _gauge("ftsup_agent_snapshot_memory_limit_bytes", "Limit on snapshot bytes held plus arriving",
                     node, budget.limit_bytes)
        if budget.derived_bytes is not None:
            yield _gauge("ftsup_agent_snapshot_memory_derived_bytes",
                         "What the job's snapshot sizes call for: ranks x largest snapshot x copies + headroom",
                         node, budget.derived_bytes)
        basis = GaugeMetricFamily("ftsup_agent_snapshot_memory_limit_basis",
                                  "Where the limit comes from (1 on the current basis)", labels=["node", "basis"])
        basis.add_metric([self._node_id, budget.basis.value], 1)
        yield basis
        yield _gauge("ftsup_agent_reports_queued", "Reports waiting for the supervisor", node, len(self._reports))
        yield _gauge("ftsup_agent_reports_dropped", "Reports dropped because the queue was full", node,
                     self._reports.dropped)
        if self._warm_idle is not None:
            yield _gauge("ftsup_agent_warm_trainers_idle", "Pre-warmed trainer processes ready to launch",
                         node, self._warm_idle())
        last_step = GaugeMetricFamily("ftsup_agent_rank_last_step", "Newest step a rank reported",
                                      labels=["node", "rank"])
        step_time = GaugeMetricFamily("ftsup_agent_rank_step_seconds", "A rank's latest step time",
                                      labels=["node", "rank"])
        silent = GaugeMetricFamily("ftsup_agent_rank_seconds_since_progress",
                                   "Since a rank last completed a step (the hang watcher's input)",
                                   labels=["node", "rank"])
        now = self._progress.now()
        for rank, progress in sorted(self._progress.ranks.items()):
            labels = [self._node_id, str(rank)]
            last_step.add_metric(labels, progress.last_step)
            if progress.step_times_s:
                step_time.add_metric(labels, progress.step_times_s[-1])
            silent.add_metric(labels, max(0.0, now - progress.last_progress_s))
        yield from (last_step, step_time, silent)


def agent_registry(collector: AgentCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    registry.register(LoopCollector())
    return registry


def _gauge(name: str, documentation: str, node: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["node"])
    family.add_metric(node, value)
    return family
