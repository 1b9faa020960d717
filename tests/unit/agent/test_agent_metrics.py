"""The agent's /metrics page, scraped over real HTTP: what the node holds and how its ranks move."""

from __future__ import annotations

import hashlib

from ftsup.agent.link import Reports
from ftsup.agent.metrics import AgentCollector, agent_registry
from ftsup.agent.progress import ProgressTracker
from ftsup.agent.snapshots import Blob, SnapshotStore
from ftsup.common.metrics_http import serve_metrics
from tests.unit.supervisor.test_metrics import sample, scrape


class Clock:
    now = 50.0

    def __call__(self) -> float:
        return self.now


async def test_a_scrape_shows_snapshots_held_trainers_and_rank_progress():
    store = SnapshotStore()
    payload = b"x" * 1000
    store.put(Blob(1, 0, 7, "n1", payload, hashlib.sha256(payload).hexdigest()))
    clock = Clock()
    progress = ProgressTracker(clock=clock)
    progress.start_generation(1, (0, 1))
    progress.record_step(1, 0, 7, 0.25)
    clock.now = 53.0
    collector = AgentCollector("n1", store, lambda: (1, (0, 1), {0}), progress, Reports(), lambda: 2)
    server = await serve_metrics(agent_registry(collector), "127.0.0.1:0")
    try:
        status, body = await scrape(server.sockets[0].getsockname()[1])
    finally:
        server.close()
    assert status == "HTTP/1.1 200 OK"
    node = 'node="n1"'
    assert sample(body, "ftsup_agent_snapshot_bytes", node) == 1000
    # (a blob put, not received: no receive buffer of the store's own to keep or reuse)
    assert sample(body, "ftsup_agent_snapshot_spare_bytes", node) == 0
    assert sample(body, "ftsup_agent_snapshot_buffers_reused", node) == 0
    assert sample(body, "ftsup_agent_trainers_alive", node) == 1
    assert sample(body, "ftsup_agent_ranks_assigned", node) == 2
    assert sample(body, "ftsup_agent_rank_last_step", 'node="n1",rank="0"') == 7
    assert sample(body, "ftsup_agent_rank_step_seconds", 'node="n1",rank="0"') == 0.25
    assert sample(body, "ftsup_agent_rank_seconds_since_progress", 'node="n1",rank="0"') == 3.0
    assert sample(body, "ftsup_agent_rank_seconds_since_progress", 'node="n1",rank="1"') == 3.0
    assert sample(body, "ftsup_agent_warm_trainers_idle", node) == 2
    # the scrape is answered on the loop: at least this test's task and the connection's handler
    assert sample(body, "ftsup_asyncio_tasks", "") >= 2
