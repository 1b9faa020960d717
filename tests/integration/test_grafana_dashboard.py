"""The Grafana dashboard cannot rot: every metric its PromQL names is exported by a real cluster.

A supervisor and an agent of a LocalCluster serve /metrics; the names they expose after a few
training steps (histograms as their _bucket/_sum/_count series) must cover every `ftsup_*` name
in deploy/grafana/ftsup.json's panel queries and annotations.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import urllib.request

import pytest

from ftsup.agent.snapshots import physical_memory_bytes
from ftsup.harness.cluster import ClusterSpec, LocalCluster, free_port
from ftsup.harness.demo import trainer_argv

pytestmark = pytest.mark.integration

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "ftsup.json"
METRIC = re.compile(r"\bftsup_[a-z0-9_]+\b")


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    return {name for expr in exprs for name in METRIC.findall(expr)}


def exported(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def agent_metrics_url(log_path: pathlib.Path) -> str | None:
    for line in log_path.read_text(errors="replace").splitlines():
        if '"metrics served"' in line:
            return str(json.loads(line)["url"])
    return None


def test_every_metric_the_grafana_dashboard_queries_is_exported_by_a_running_cluster(tmp_path: pathlib.Path) -> None:
    names = dashboard_metrics()
    assert len(names) >= 20, names  # the dashboard covers the fleet, failures, goodput and training
    port = free_port()
    spec = ClusterSpec(nodes=1, spares=0, ranks_per_node=1, trainer_argv=trainer_argv(sys.executable, 400, seed=3),
                       heartbeat_interval_s=0.5, supervisor_args=("--metrics-listen", f"127.0.0.1:{port}"),
                       agent_args=("--metrics-listen", "127.0.0.1:0"))
    with LocalCluster(spec, tmp_path) as cluster:
        cluster.start()
        cluster.wait_for(lambda: cluster.status().step >= 3, 120, "three steps")
        agent_url = cluster.wait_for(lambda: agent_metrics_url(cluster.agents["node-1"].log_path), 30,
                                     "the agent's metrics listener")
        supervisor = f"http://127.0.0.1:{port}/metrics"
        have = cluster.wait_for(lambda: (h := exported(supervisor) | exported(agent_url)) >= names and h, 30,
                                "every dashboard metric to be exported")
        # The agent's snapshot memory limit comes from the job's snapshots it holds, not the RAM.
        limit = cluster.wait_for(lambda: derived_limit(agent_url), 30, "a limit derived from the snapshots held")
        assert 0 < limit < physical_memory_bytes() // 2
    assert not names - have


def derived_limit(url: str) -> float | None:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line.startswith("ftsup_agent_snapshot_memory")}
    if samples.get('ftsup_agent_snapshot_memory_limit_basis{basis="derived",node="node-1"}') != 1.0:
        return None
    limit = samples['ftsup_agent_snapshot_memory_limit_bytes{node="node-1"}']
    assert limit == samples['ftsup_agent_snapshot_memory_derived_bytes{node="node-1"}']
    return limit
