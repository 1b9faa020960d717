"""Which supervisor replicas are alive to hold link shards: one etcd key per replica, on a lease.

Each replica puts `<prefix>/replicas/<advertised address>` on a lease of the election's TTL and
refreshes it at TTL/3; a replica that dies stops refreshing and its key goes when the lease
expires. Every replica polls the prefix and keeps the set it saw (itself always in it), from which
common/shard_map.py picks each node's shard. The set is advisory: a replica missing from a stale
view costs a redirect, never a decision (only the leader decides, on the event log).

Given a synchronous etcd channel (`keepalive_channel`, as the election's), the lease is refreshed
from a thread (supervisor/lease_keeper.py), as the leader's is: a follower holding thousands of
agents stalls its loop (measured at 12,500 nodes: shards at 0.35-0.42 of a core on two shared
cores), and a refresh missed on the loop let the key lapse, every replica re-spread the fleet
without that shard, and its agents were moved away and back: a rack-sized churn for a stall. The
thread keeps the key while the process lives and its loop still runs at all (a loop that has not
run for `max_loop_stall_s` lets it lapse: such a shard cannot serve its agents).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable

import aetcd
import aetcd.exceptions
import grpc

from ftsup.common import logs
from ftsup.common.deadline import within
from ftsup.supervisor.leader_view import LeaseView
from ftsup.supervisor.lease_keeper import LeaseKeeper

log = logs.get("supervisor.shard_members")

POLL_S = 0.25  # how stale a replica's view of the live set may be (a dead replica's lease: + TTL)
# A loop that has not gone round for this long no longer keeps our key (the thread stops refreshing).
MAX_LOOP_STALL_S = 30.0


def members_prefix(prefix: str) -> bytes:
    return f"{prefix}/replicas/".encode()


def parse_members(prefix: str, keys: Iterable[bytes]) -> frozenset[str]:
    """The addresses named by the keys under the members prefix (others ignored)."""
    head = members_prefix(prefix)
    return frozenset(key[len(head):].decode() for key in keys if key.startswith(head) and len(key) > len(head))


class ReplicaMembers:
    """This replica's membership key, and the live replicas as last seen (`live`)."""

    def __init__(self, client: aetcd.Client, prefix: str, address: str, *, ttl_s: int = 2,
                 poll_s: float = POLL_S, is_ready: Callable[[], bool] = lambda: True,
                 keepalive_channel: Callable[[], grpc.Channel] | None = None,
                 max_loop_stall_s: float = MAX_LOOP_STALL_S) -> None:
        if not address:
            raise ValueError("a replica needs its advertised address to hold a link shard")
        self._client = client
        self._prefix = prefix
        self.address = address
        self._key = members_prefix(prefix) + address.encode()
        self._ttl_s = ttl_s
        self._poll_s = poll_s
        # Our key is put only once we can hold agents (leading, or our relay to the leader came up
        # once): a replica that (re)starts takes its share only when it can serve it.
        self._is_ready = is_ready
        self._timeout_s = max(0.5, ttl_s / 3)
        self._keepalive_channel = keepalive_channel
        self._max_loop_stall_s = max_loop_stall_s
        self._keeper: LeaseKeeper | None = None
        self._keeper_lost = ""  # why the keeper's lease ended (set on the loop, from its thread)
        self._loop_seen_at = -math.inf  # when run()'s loop last went round (the keeper reads it)
        self.live: frozenset[str] = frozenset({address})
        self.changed = asyncio.Event()  # set whenever `live` changes (the shard re-checks its nodes)

    async def run(self) -> None:
        """Keeps our key alive and `live` current until cancelled; our key is revoked on the way out."""
        lease_id = 0
        next_refresh = 0.0
        loop = asyncio.get_running_loop()
        try:
            while True:
                now = self._loop_seen_at = loop.time()
                if self._keeper_lost:
                    log.warning("replica membership lease lost; taking a new one", why=self._keeper_lost)
                    await self._stop_keeper()
                    lease_id, next_refresh = 0, now
                if self._keeper is None and now >= next_refresh and (lease_id or self._is_ready()):
                    lease_id, next_refresh = await self._keep(lease_id, now)
                    if lease_id and self._keepalive_channel is not None:
                        self._start_keeper(lease_id, now)
                await self._poll()
                await asyncio.sleep(self._poll_s)
        finally:
            await self._stop_keeper()
            if lease_id:
                # Leaving is the last thing a replica does, so its revoke may take a whole TTL: a
                # loaded etcd (650 ms applies under two busy loops) missed the refresh deadline
                # here, and the key stayed for its TTL, the other replicas counting us meanwhile.
                with contextlib.suppress(Exception):
                    await within(self._client.revoke_lease(lease_id), max(self._timeout_s, float(self._ttl_s)))

    def _start_keeper(self, lease_id: int, granted_at: float) -> None:
        """Hands the refreshes of `lease_id` (granted or refreshed at `granted_at`) to a thread."""
        assert self._keepalive_channel is not None
        loop = asyncio.get_running_loop()

        def lost(why: str) -> None:  # (on the keeper's thread)
            loop.call_soon_threadsafe(setattr, self, "_keeper_lost", why)

        self._keeper_lost = ""
        self._keeper = LeaseKeeper(self._keepalive_channel, lease_id, LeaseView(float(self._ttl_s), granted_at),
                                   timeout_s=self._timeout_s, on_lost=lost, clock=loop.time,
                                   name=f"member {self.address}", loop_seen=lambda: self._loop_seen_at,
                                   max_loop_stall_s=self._max_loop_stall_s)
        self._keeper.start()

    async def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await asyncio.to_thread(keeper.stop)  # (joins the thread: not on the loop)
        self._keeper_lost = ""

    async def _keep(self, lease_id: int, now: float) -> tuple[int, float]:
        """Refreshes our lease (or takes a new one and puts our key); the next refresh time."""
        try:
            if lease_id:
                reply = await within(self._client.refresh_lease(lease_id), self._timeout_s)
                if reply is not None and int(reply.TTL) > 0:
                    return lease_id, now + self._ttl_s / 3
            lease = await within(self._client.lease(self._ttl_s), self._timeout_s)
            try:
                await within(self._client.put(self._key, b"", lease=lease.id), self._timeout_s)
            except BaseException:  # (cancelled too: the put may have landed, and run() never saw this lease)
                with contextlib.suppress(Exception):
                    await within(self._client.revoke_lease(lease.id), max(self._timeout_s, float(self._ttl_s)))
                raise
            return lease.id, now + self._ttl_s / 3
        except (aetcd.exceptions.ClientError, TimeoutError) as exc:
            log.info("replica membership refresh failed; retrying", error=repr(exc))
            return lease_id, now + min(0.2, self._ttl_s / 10)

    async def _poll(self) -> None:
        try:
            got = await within(self._client.get_prefix(members_prefix(self._prefix), keys_only=True),
                                         self._timeout_s)
        except (aetcd.exceptions.ClientError, TimeoutError) as exc:
            log.debug("replica membership poll failed", error=repr(exc))
            return
        live = parse_members(self._prefix, (kv.key for kv in got)) | {self.address}
        if live != self.live:
            log.info("live replicas changed", live=sorted(live), was=sorted(self.live))
            self.live = live
            self.changed.set()
