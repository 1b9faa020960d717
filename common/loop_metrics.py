"""Gauges of the process's own event loop, for soak runs and for operators chasing a leak.

`ftsup_asyncio_tasks` counts the loop's unfinished tasks at scrape time (scrapes are answered on
the loop itself, common/metrics_http.py, so `asyncio.all_tasks()` reads its own loop). A count
that grows with every recovery is a task leak; `ftsup chaos soak` checks it against a bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class LoopCollector(Collector):
    def describe(self) -> Sequence[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:  # scraped off the loop (a test calling collect directly): unknown
            return
        yield GaugeMetricFamily("ftsup_asyncio_tasks", "Unfinished asyncio tasks of this process's event loop",
                                value=tasks)
