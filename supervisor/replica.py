"""One replica of a replicated supervisor: follow the log, campaign, lead, step down, repeat.

While following, the replica folds the leader's records into its own state (a hot copy that
answers read-only operator queries) and, with link shards, relays its share of the agents to the
leader (supervisor/shard.py); without them it points agents at the leader. Once it wins the election it
catches up to the head, grants every node a full timeout of grace, and decides. It steps down the
moment its lease is lost or an append shows another replica leads (fencing) — it never decides
on a term it cannot prove it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ftsup.common import logs
from ftsup.common.backoff import Backoff
from ftsup.common.deadline import within
from ftsup.supervisor.eventlog.api import LogUnavailable
from ftsup.supervisor.eventlog.etcd import EtcdLog
from ftsup.supervisor.leader import LeaderElection
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.shard import LinkShard
from ftsup.supervisor.shard_members import ReplicaMembers

log = logs.get("supervisor.replica")


async def follow_log(runtime: Runtime, event_log: EtcdLog) -> None:
    in_force = runtime.generation_in_force
    async for record in event_log.follow(runtime.state.applied_seq + 1):
        runtime.apply_followed(record)
        if runtime.generation_in_force != in_force:
            # A follower's shard logs lines about its nodes naming the generation in force; this
            # line says when that changed (records are folded here without a line each).
            in_force = runtime.generation_in_force
            log.info("following", generation=in_force, applied_seq=runtime.state.applied_seq,
                     leader=runtime.leader_address or "unknown")


async def track_leader(runtime: Runtime, election: LeaderElection, period_s: float = 0.5) -> None:
    """Keeps the follower's idea of the leader current (its NotLeader answers, its shard's routing).

    A lookup that fails (etcd slow or unreachable) says nothing about who leads: the last answer
    stands until one comes. Blanking it made the link shard count the leader as an agent holder
    for that moment and move a third of its nodes to it, which sent them straight back."""
    failing_since: float | None = None
    while True:
        try:
            current = await election.current()
        except Exception as exc:
            if failing_since is None:
                failing_since = time.monotonic()
                log.info("leader lookup failing; keeping the last known leader",
                         leader=runtime.leader_address or "unknown", error=str(exc) or type(exc).__name__)
        else:
            runtime.leader_address = current.address if current is not None else ""
            if failing_since is not None:
                log.info("leader lookup answering again", leader=runtime.leader_address or "none",
                         failed_for_s=round(time.monotonic() - failing_since, 2))
                failing_since = None
        await asyncio.sleep(period_s)


SYNC_BACKOFF = Backoff(initial_s=0.1, max_s=1.0)


async def sync_while_leading(event_log: EtcdLog, election: LeaderElection, backoff: Backoff = SYNC_BACKOFF,
                             rng: random.Random | None = None) -> bool:
    """Catches up to the log's head, retrying an etcd timeout (LogUnavailable) while our lease
    holds: one slow etcd answer must not end the process of a newly elected leader. False when
    the lease was lost first (the caller resigns and campaigns again)."""
    rng = rng or random.Random()
    attempt = 0
    while not election.lost.is_set():
        try:
            await event_log.sync()
            return True
        except LogUnavailable as exc:
            attempt += 1
            log.warning("log sync failed after winning the election; retrying while the lease holds",
                        error=str(exc), attempt=attempt)
            await asyncio.sleep(backoff.delay_s(attempt, rng))
    return False


# Besides on every change of the live replicas, nodes held away from their shard are moved home
# this often: an agent that could not reach its shard (a restart, a brief partition) is taken in
# by its next replica on its word, and must not stay there once its shard answers again.
REHOME_EVERY_S = 15.0


async def rehome_on_change(members: ReplicaMembers, *movers: Callable[[], int],
                           every_s: float = REHOME_EVERY_S) -> None:
    """Moves the nodes whose shard changed whenever the live replicas change (and every `every_s`):
    `movers` are the follower's shard and the leader's agent service (each moves what it holds)."""
    while True:
        with contextlib.suppress(TimeoutError):
            await within(members.changed.wait(), every_s)
        members.changed.clear()
        for move in movers:
            move()


# How long a cancelled task may take to stop before it is cancelled again (and named in the log).
STOP_PATIENCE_S = 1.0


def _where(task: asyncio.Task[Any]) -> str:
    """A task's name and the line it is suspended at, for a log line about a task that will not stop."""
    frames = task.get_stack(limit=1)
    if not frames:
        return task.get_name()
    code = frames[-1].f_code
    return f"{task.get_name()} at {code.co_filename.rsplit('/', 1)[-1]}:{frames[-1].f_lineno} ({code.co_name})"


async def stop_tasks(tasks: Sequence[asyncio.Task[Any]], what: str,
                     patience_s: float = STOP_PATIENCE_S) -> None:
    """Cancels `tasks` and waits until all have ended, cancelling the ones still running again
    every `patience_s`: a cancel lost in a library (aetcd's watcher, Python 3.11's wait_for;
    common/deadline.py) then costs a second, not the takeover. Each round still waiting logs
    which tasks and where they stand, so a takeover that the watchdog ends says what it waited on."""
    pending: set[asyncio.Task[Any]] = {task for task in tasks if not task.done()}
    rounds = 0
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=patience_s)
        rounds += 1
        if pending:
            log.warning("tasks did not stop when cancelled; cancelling them again", what=what,
                        waited_s=round(rounds * patience_s, 1), tasks=sorted(_where(task) for task in pending))
    await asyncio.gather(*tasks, return_exceptions=True)  # (all done: collects their outcomes)


# A replica that won the election must lead within this: stop following and load the log. Its
# lease is refreshed from a thread (supervisor/lease_keeper.py), so a takeover stuck on an await
# that never ends (seen once under heavy load: a follower task that did not stop, or a log load
# that did not return, for 3 minutes) would hold leadership while nobody leads.
TAKEOVER_LIMIT_S = 60.0
EXIT_WEDGED = 75  # (EX_TEMPFAIL) systemd restarts it; the lease lapses with the process


def _wedged_takeover(election: LeaderElection, term: int, limit_s: float,
                     exit_process: Callable[[int], object] = os._exit) -> None:
    """(A timer on the loop, which still runs: only the takeover is stuck.) Gives the lease up
    the only sure way, by ending the process: the keepalive thread stops with it, the lease
    lapses within its TTL and another replica leads; systemd starts this one afresh."""
    log.error("won the election but could not take over; exiting so that another replica leads",
              term=term, limit_s=limit_s, exit_code=EXIT_WEDGED)
    election.abandon_lease()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    exit_process(EXIT_WEDGED)


async def run_replica(runtime: Runtime, election: LeaderElection, event_log: EtcdLog,
                      shard: LinkShard | None = None, *, takeover_limit_s: float = TAKEOVER_LIMIT_S,
                      exit_process: Callable[[int], object] = os._exit) -> None:
    runtime.become_follower()
    while True:
        follower = asyncio.create_task(follow_log(runtime, event_log), name="follow_log")
        tracker = asyncio.create_task(track_leader(runtime, election), name="track_leader")
        tasks = [follower, tracker]
        if shard is not None:  # while following, this replica's share of the agents goes through the leader
            tasks.append(asyncio.create_task(shard.relay_forever(lambda: runtime.leader_address), name="relay"))
        watchdog: asyncio.TimerHandle | None = None
        try:
            leader = await election.run_until_leader()
            watchdog = asyncio.get_running_loop().call_later(takeover_limit_s, _wedged_takeover, election,
                                                             leader.term, takeover_limit_s, exit_process)
        finally:
            try:
                await stop_tasks(tasks, "the follower's tasks")
            except BaseException:  # (cancelled meanwhile: a shutdown must not meet the watchdog)
                if watchdog is not None:
                    watchdog.cancel()
                raise
        try:
            if not await sync_while_leading(event_log, election):
                log.warning("stepping down before leading: the log could not be read while the lease held",
                            term=leader.term)
                with contextlib.suppress(Exception):
                    await election.resign()
                continue
        finally:
            if watchdog is not None:
                watchdog.cancel()
        runtime.become_leader(leader.term, leader.address)
        lost = asyncio.create_task(election.lost.wait())
        deposed = asyncio.create_task(runtime.deposed.wait())
        await asyncio.wait({lost, deposed}, return_when=asyncio.FIRST_COMPLETED)
        for waiter in (lost, deposed):
            waiter.cancel()
        why = "lease lost" if election.lost.is_set() else "deposed by a newer leader"
        log.warning("stepping down", term=leader.term, why=why)
        runtime.become_follower()
        if not election.lost.is_set():
            with contextlib.suppress(Exception):
                await election.resign()
