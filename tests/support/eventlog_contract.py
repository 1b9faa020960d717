"""The EventLog contract: every backend (memory twin, embedded files, later etcd) must pass it.

Each check takes a factory returning a fresh, empty log, or an awaitable of one (a backend that
opens asynchronously, like etcd); backend test modules parametrize over these checks
(tests/unit/supervisor/test_eventlog_contract.py, tests/integration/test_etcd_eventlog.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable

import pytest

from ftsup.supervisor.core.events import GenerationRunning, NodeCleared, SnapshotCommitted
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.api import EventLog, Fenced, LogCompacted

MakeLog = Callable[[], EventLog | Awaitable[EventLog]]


async def opened(make: MakeLog) -> EventLog:
    log = make()
    return await log if inspect.isawaitable(log) else log


def cleared(i: int) -> NodeCleared:
    return NodeCleared(f"n{i}", f"reason {i}")


async def appends_get_gapless_seqs_and_read_returns_the_tail(make: MakeLog) -> None:
    log = await opened(make)
    assert log.head_seq == 0 and list(log.read()) == []
    first = await log.append([cleared(1), cleared(2)], term=3, time_unix_s=10.0)
    second = await log.append([SnapshotCommitted(1, 7)], term=3, time_unix_s=11.0)
    assert [r.seq for r in first + second] == [1, 2, 3] and log.head_seq == 3
    assert [(r.term, r.time_unix_s) for r in first] == [(3, 10.0), (3, 10.0)]
    assert list(log.read()) == first + second
    assert list(log.read(3)) == second and list(log.read(4)) == []
    assert await log.append([], term=3, time_unix_s=12.0) == []
    log.close()


async def a_conditional_append_on_a_moved_head_is_fenced_and_writes_nothing(make: MakeLog) -> None:
    log = await opened(make)
    await log.append([cleared(1)], term=1, time_unix_s=1.0, expect_seq=0)
    with pytest.raises(Fenced) as fenced:
        await log.append([cleared(2)], term=1, time_unix_s=1.0, expect_seq=0)
    assert fenced.value.head_seq == 1 and log.head_seq == 1
    await log.append([cleared(2)], term=1, time_unix_s=1.0, expect_seq=1)
    assert log.head_seq == 2
    log.close()


async def concurrent_appends_each_stay_contiguous(make: MakeLog) -> None:
    log = await opened(make)

    async def writer(task: int) -> list[int]:
        seqs = []
        for batch in range(5):
            events = [NodeCleared(f"t{task}", f"{batch}.{i}") for i in range(1 + task % 3)]
            seqs.extend(r.seq for r in await log.append(events, term=0, time_unix_s=0.0))
        return seqs

    results = await asyncio.gather(*(writer(t) for t in range(64)))
    every = sorted(seq for seqs in results for seq in seqs)
    assert every == list(range(1, log.head_seq + 1))
    by_seq = {r.seq: r.event for r in log.read()}
    for task, seqs in enumerate(results):
        assert all(by_seq[s].node_id == f"t{task}" for s in seqs)
    log.close()


async def follow_yields_existing_then_new_records(make: MakeLog) -> None:
    log = await opened(make)
    await log.append([cleared(1)], term=0, time_unix_s=1.0)
    seen: list[int] = []

    async def reader() -> None:
        async for record in log.follow(1):
            seen.append(record.seq)
            if record.seq == 3:
                return

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)
    await log.append([cleared(2), cleared(3)], term=0, time_unix_s=2.0)
    await asyncio.wait_for(task, timeout=5)
    assert seen == [1, 2, 3]
    log.close()


async def a_snapshot_round_trips_and_compaction_drops_only_covered_records(make: MakeLog) -> None:
    log = await opened(make)
    for i in range(30):
        await log.append([cleared(i)], term=0, time_unix_s=float(i))
    assert log.load_snapshot() is None
    with pytest.raises(ValueError, match="beyond the log head"):
        await log.save_snapshot(ClusterState(applied_seq=31))
    older = dataclasses.replace(ClusterState(), applied_seq=10, last_generation=2)
    newer = dataclasses.replace(ClusterState(), applied_seq=20, last_generation=3)
    await log.save_snapshot(older)
    await log.save_snapshot(newer)
    assert log.load_snapshot() == newer
    await log.compact()
    # Only what the *older* retained snapshot covers may go: it is the newer one's fallback.
    assert 1 <= log.first_seq <= 11
    assert [r.seq for r in log.read(11)] == list(range(11, 31))
    if log.first_seq > 1:
        with pytest.raises(LogCompacted):
            list(log.read(1))
    await log.append([GenerationRunning(1, 1)], term=0, time_unix_s=99.0)
    assert log.head_seq == 31
    log.close()


CONTRACT = [
    appends_get_gapless_seqs_and_read_returns_the_tail,
    a_conditional_append_on_a_moved_head_is_fenced_and_writes_nothing,
    concurrent_appends_each_stay_contiguous,
    follow_yields_existing_then_new_records,
    a_snapshot_round_trips_and_compaction_drops_only_covered_records,
]
