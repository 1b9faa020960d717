"""Leader election on etcd: which supervisor replica may decide and append, and its term.

Owns the key `<prefix>/leader` (value: the leader's address), bound to a lease of `ttl_s`. A
candidate wins with a put-if-absent transaction; its **term** is the key's create revision, which
etcd makes strictly larger for every new leader, and which EtcdLog compares in every append
(fence_key), so a deposed or paused leader cannot write (DESIGN.md "Event log").
aetcd has only a one-shot lease refresh: we run our own keepalive at TTL/3. Leadership is lost when
etcd says the lease is gone, or when no refresh has succeeded for a whole TTL counted from when the
last good one was *sent* (the server's expiry is never earlier, so we step down first).
The decision is pure (`after_keepalive`, `leads_at`); the class is the shell around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import aetcd
import aetcd.exceptions
import aetcd.rtypes
import grpc
from aetcd import transactions as tx

from ftsup.common.deadline import within
from ftsup.supervisor.leader_view import LeaseView, after_keepalive, leads_at, next_refresh_in
from ftsup.supervisor.lease_keeper import LeaseKeeper

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 2
# A leader whose event loop has not completed an etcd read for this long lets its lease lapse
# (supervisor/lease_keeper.py): ten times the longest stall measured (a 12,500-node generation
# start on a loaded machine, ~3 s).
MAX_LOOP_STALL_S = 30.0


@dataclass(frozen=True, slots=True)
class Leader:
    address: str
    term: int  # the leader key's create revision


class LeaderElection:
    """One replica's candidacy. `await run_until_leader()`; then `lost` is set when it ends."""

    def __init__(
        self,
        client: aetcd.Client,
        prefix: str,
        address: str,
        *,
        ttl_s: int = DEFAULT_TTL_S,
        op_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_lost: Callable[[Leader], None] | None = None,
        keepalive_channel: Callable[[], grpc.Channel] | None = None,
        max_loop_stall_s: float = MAX_LOOP_STALL_S,
    ) -> None:
        if ttl_s < 1 or int(ttl_s) != ttl_s:
            raise ValueError(f"lease ttl_s must be a whole number of seconds >= 1 (etcd), got {ttl_s}")
        self._client = client
        self.key = f"{prefix}/leader"
        self._key = self.key.encode()
        self.address = address
        self.ttl_s = int(ttl_s)
        self._timeout_s = op_timeout_s if op_timeout_s is not None else self.ttl_s / 3
        self._clock = clock
        self._on_lost = on_lost
        self.leader: Leader | None = None  # set while we lead
        self.lost = asyncio.Event()
        self._lease_id = 0
        self._view = LeaseView(float(self.ttl_s), -math.inf, is_revoked=True)
        self._keepalive: asyncio.Task[None] | None = None
        # A synchronous channel to etcd for the keepalive thread (supervisor/lease_keeper.py: the
        # lease survives a stalled event loop); None: refresh on the loop (tests, tools).
        self._keepalive_channel = keepalive_channel
        self._keeper: LeaseKeeper | None = None
        self._max_loop_stall_s = max_loop_stall_s
        self._loop_seen_at = -math.inf  # when our loop last ran while leading (the keeper reads it)
        self._loop_marker: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        return self.leader is not None and leads_at(self._lease_view(), self._clock())

    def _lease_view(self) -> LeaseView:
        return self._keeper.view if self._keeper is not None else self._view

    async def current(self) -> Leader | None:
        """Who leads now, per etcd (for followers' NotLeader answers and `supervisorctl leader`)."""
        got = await within(self._client.get(self._key), self._timeout_s)
        return None if got is None else Leader(got.value.decode(), got.create_revision)

    async def campaign(self) -> Leader | None:
        """One attempt: put-if-absent of the leader key on a fresh lease. Returns our leadership or None."""
        sent_at = self._clock()
        lease = await within(self._client.lease(self.ttl_s), self._timeout_s)
        try:
            ok, responses = await within(
                self._client.transaction(
                    [tx.Create(self._key) == 0],
                    [tx.Put(self._key, self.address.encode(), lease=lease.id), tx.Get(self._key)],
                    [tx.Get(self._key)],
                ),
                self._timeout_s,
            )
        except BaseException:
            await self._revoke(lease.id)
            raise
        if not ok:
            await self._revoke(lease.id)
            return None
        kv = responses[-1][0][1]
        self._lease_id = lease.id
        self._view = LeaseView(float(self.ttl_s), sent_at)
        self.leader = Leader(self.address, kv.create_revision)
        self.lost = asyncio.Event()
        if self._keepalive_channel is not None:
            loop = asyncio.get_running_loop()
            self._loop_seen_at = self._clock()
            self._loop_marker = asyncio.create_task(self._mark_loop_alive(), name=f"leader-loop-marker {self.key}")
            self._keeper = LeaseKeeper(self._keepalive_channel, lease.id, self._view, timeout_s=self._timeout_s,
                                       on_lost=lambda why: loop.call_soon_threadsafe(self._step_down, why),
                                       clock=self._clock, name=self.key, loop_seen=lambda: self._loop_seen_at,
                                       max_loop_stall_s=self._max_loop_stall_s)
            self._keeper.start()
        else:
            self._keepalive = asyncio.create_task(self._keep_alive(), name=f"leader-keepalive {self.key}")
        log.info("leading %s at term %d", self.key, kv.create_revision)
        return self.leader

    async def run_until_leader(self, *, poll_s: float | None = None) -> Leader:
        """Campaigns until we win: between attempts, waits for the key's deletion (or `poll_s`)."""
        poll = poll_s if poll_s is not None else self.ttl_s / 4
        while True:
            try:
                won = await self.campaign()
                if won is not None:
                    return won
                await self._wait_for_vacancy(poll)
            except (aetcd.exceptions.ClientError, TimeoutError) as exc:
                log.info("campaign for %s failed (%r); retrying", self.key, exc)
                await asyncio.sleep(poll)

    async def _wait_for_vacancy(self, timeout_s: float) -> None:
        got = await within(self._client.get(self._key), self._timeout_s)
        if got is None:
            return
        with contextlib.suppress(aetcd.exceptions.ClientError, TimeoutError):
            await within(
                self._client.watch_once(
                    self._key, start_revision=got.mod_revision + 1, kind=aetcd.rtypes.EventKind.DELETE
                ),
                timeout_s,
            )

    async def _mark_loop_alive(self) -> None:
        """Tells the keepalive thread our loop still gets answers from etcd: a read of our key per
        quarter TTL. A loop that is wedged, or whose gRPC calls no longer complete (seen once: an
        asyncio etcd call that never returned after a long stall, in a process where a synchronous
        channel ran meanwhile), stops marking, and the lease lapses MAX_LOOP_STALL_S later."""
        while True:
            with contextlib.suppress(aetcd.exceptions.ClientError, TimeoutError):
                await within(self._client.get(self._key), self._timeout_s)
                self._loop_seen_at = self._clock()
            await asyncio.sleep(self.ttl_s / 4)

    async def _keep_alive(self) -> None:
        failed = False
        while True:
            await asyncio.sleep(next_refresh_in(self._view, failed=failed))
            sent_at = self._clock()
            granted: int | None = None
            try:
                reply = await within(self._client.refresh_lease(self._lease_id), self._timeout_s)
                granted = int(reply.TTL) if reply is not None else None
            except (aetcd.exceptions.ClientError, TimeoutError) as exc:
                log.info("lease refresh for %s failed: %r", self.key, exc)
            failed = granted is None
            self._view = after_keepalive(self._view, sent_at, granted)
            if not leads_at(self._view, self._clock()):
                self._step_down("lease revoked" if self._view.is_revoked else "no refresh within the TTL")
                return

    def _step_down(self, why: str) -> None:
        leader, self.leader = self.leader, None
        if leader is None:
            return
        log.warning("lost leadership of %s at term %d: %s", self.key, leader.term, why)
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()
            self._view = keeper.view
        marker, self._loop_marker = self._loop_marker, None
        if marker is not None:
            marker.cancel()
        self._view = dataclasses.replace(self._view, is_revoked=True)
        self.lost.set()
        if self._on_lost is not None:
            self._on_lost(leader)

    def abandon_lease(self) -> None:
        """Stops refreshing the lease without a word to etcd (it lapses within its TTL): for a
        process about to end that cannot trust its event loop to finish a resign."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()

    async def resign(self) -> None:
        """Gives up leadership now: deletes our key (only our incarnation of it) and the lease."""
        leader = self.leader
        if self._keeper is not None:
            await asyncio.to_thread(self._keeper.stop)  # (returns within one refresh call)
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(BaseException):
                await self._keepalive
        if leader is None:
            return
        self._step_down("resigned")
        with contextlib.suppress(aetcd.exceptions.ClientError, TimeoutError):
            await within(
                self._client.transaction([tx.Create(self._key) == leader.term], [tx.Delete(self._key)], []),
                self._timeout_s,
            )
        await self._revoke(self._lease_id)

    async def _revoke(self, lease_id: int) -> None:
        with contextlib.suppress(aetcd.exceptions.ClientError, TimeoutError):
            await within(self._client.revoke_lease(lease_id), self._timeout_s)
