"""A newly elected replica rides out an etcd timeout while its lease holds (issue 16, item 11)."""

from __future__ import annotations

import asyncio
import random

from ftsup.common.backoff import Backoff
from ftsup.supervisor.eventlog.api import LogUnavailable
from ftsup.supervisor.replica import sync_while_leading

FAST = Backoff(initial_s=0.001, max_s=0.001)


class SlowEtcd:
    """sync() times out `failures` times, then works."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def sync(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise LogUnavailable("etcd: context deadline exceeded")


class Election:
    def __init__(self) -> None:
        self.lost = asyncio.Event()


async def test_a_new_leader_retries_a_timed_out_sync_instead_of_exiting() -> None:
    etcd = SlowEtcd(failures=2)
    assert await sync_while_leading(etcd, Election(), FAST, random.Random(0))  # type: ignore[arg-type]
    assert etcd.calls == 3


async def test_a_new_leader_whose_lease_is_lost_stops_syncing_and_says_so() -> None:
    election = Election()
    etcd = SlowEtcd(failures=10**9)
    task = asyncio.create_task(sync_while_leading(etcd, election, FAST, random.Random(0)))  # type: ignore[arg-type]
    while etcd.calls < 3:
        await asyncio.sleep(0.001)
    election.lost.set()
    assert await asyncio.wait_for(task, 5) is False
