"""A newly elected replica rides out an etcd timeout while its lease holds (issue 16, item 11), and
exits when its takeover is stuck for good (its lease then lapses with the process)."""

from __future__ import annotations

import asyncio
import contextlib
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


class WonElection(Election):
    """Wins at once; records what the watchdog does to the lease."""

    def __init__(self) -> None:
        super().__init__()
        self.abandoned = False

    async def run_until_leader(self):  # type: ignore[no-untyped-def]
        from ftsup.supervisor.leader import Leader
        await asyncio.sleep(0.05)  # (campaigning: the follower runs meanwhile)
        return Leader("me:1", 7)

    async def current(self) -> None:
        return None

    def abandon_lease(self) -> None:
        self.abandoned = True


class StubbornLog:
    """A follower's log whose follow() does not stop when cancelled (as a task that swallows its
    CancelledError would), so the takeover cannot finish."""

    def __init__(self) -> None:
        self.released = False  # (the test lets it stop at the end)

    async def follow(self, since_seq: int):  # type: ignore[no-untyped-def]
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if self.released:
                    raise
        yield  # (an async generator)

    async def sync(self) -> None:
        return None


async def test_a_replica_whose_takeover_is_stuck_gives_its_lease_up_and_exits() -> None:
    from ftsup.supervisor.eventlog.memory import MemoryLog
    from ftsup.supervisor.replica import EXIT_WEDGED, run_replica
    from ftsup.supervisor.runtime import Runtime
    from tests.support.builders import config

    exits: list[int] = []
    election, stubborn = WonElection(), StubbornLog()
    runtime = Runtime(config(), MemoryLog())
    replica = asyncio.create_task(run_replica(runtime, election, stubborn, takeover_limit_s=0.2,  # type: ignore[arg-type]
                                              exit_process=exits.append))
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while not exits:
            assert asyncio.get_running_loop().time() < deadline, "the takeover watchdog never fired"
            await asyncio.sleep(0.01)
        assert exits == [EXIT_WEDGED] and election.abandoned and not runtime.is_leader
    finally:
        stubborn.released = True
        replica.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(replica, 5)


class OnceDeafLog(StubbornLog):
    """follow() loses the first cancel (as a poll through Python 3.11's wait_for does when its
    answer lands in the same iteration) and honours the next."""

    async def follow(self, since_seq: int):  # type: ignore[no-untyped-def]
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(3600)
        yield  # (an async generator)


async def test_a_follower_task_that_loses_a_cancel_is_cancelled_again_and_the_takeover_completes() -> None:
    from ftsup.supervisor.eventlog.memory import MemoryLog
    from ftsup.supervisor.replica import run_replica
    from ftsup.supervisor.runtime import Runtime
    from tests.support.builders import config

    exits: list[int] = []
    runtime = Runtime(config(), MemoryLog())
    runtime.become_follower()  # (as run_replica's first step does: not leading until the takeover)
    replica = asyncio.create_task(run_replica(runtime, WonElection(), OnceDeafLog(), takeover_limit_s=30,  # type: ignore[arg-type]
                                              exit_process=exits.append))
    try:
        deadline = asyncio.get_running_loop().time() + 10  # one patience round (1 s) is enough
        while not runtime.is_leader:
            assert asyncio.get_running_loop().time() < deadline, "the takeover waited on a task that lost a cancel"
            assert not replica.done(), replica
            await asyncio.sleep(0.01)
        assert exits == []
    finally:
        replica.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(replica, 5)


class ScriptedLookup:
    """election.current() answering from a script: a Leader, None (no leader key) or an exception."""

    def __init__(self, answers: list[object]) -> None:
        self.answers = answers
        self.asked = 0

    async def current(self):  # type: ignore[no-untyped-def]
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_a_failed_leader_lookup_keeps_the_last_known_leader_and_no_leader_key_clears_it() -> None:
    """A slow etcd is no news about who leads; an absent leader key is (the follower then answers 'retry')."""
    from ftsup.supervisor.leader import Leader
    from ftsup.supervisor.replica import track_leader

    class Follower:
        leader_address = ""

    steps: list[tuple[object, str]] = [(Leader("a:1", 3), "a:1"), (TimeoutError("etcd slow"), "a:1"),
                                       (LogUnavailable("etcd down"), "a:1"), (Leader("b:1", 9), "b:1"),
                                       (None, "")]
    runtime, lookup = Follower(), ScriptedLookup([answer for answer, _ in steps])
    tracker = asyncio.create_task(track_leader(runtime, lookup, period_s=0.001))  # type: ignore[arg-type]
    try:
        deadline = asyncio.get_running_loop().time() + 10
        seen: list[str] = []
        while lookup.asked <= len(steps):
            assert asyncio.get_running_loop().time() < deadline, "the tracker stopped asking"
            if lookup.asked and len(seen) < lookup.asked:
                seen.append(runtime.leader_address)
            await asyncio.sleep(0)
        assert seen[:len(steps)] == [expected for _, expected in steps]
    finally:
        tracker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tracker
