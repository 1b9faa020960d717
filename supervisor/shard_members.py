"""Which supervisor replicas are alive to hold link shards: one etcd key per replica, on a lease.

Each replica puts `<prefix>/replicas/<advertised address>` on a lease of the election's TTL and
refreshes it at TTL/3; a replica that dies stops refreshing and its key goes when the lease
expires. Every replica polls the prefix and keeps the set it saw (itself always in it), from which
common/shard_map.py picks each node's shard. The set is advisory: a replica missing from a stale
view costs a redirect, never a decision (only the leader decides, on the event log).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

import aetcd
import aetcd.exceptions

from ftsup.common import logs
from ftsup.common.deadline import within

log = logs.get("supervisor.shard_members")

POLL_S = 0.25  # how stale a replica's view of the live set may be (a dead replica's lease: + TTL)


def members_prefix(prefix: str) -> bytes:
    return f"{prefix}/replicas/".encode()


def parse_members(prefix: str, keys: Iterable[bytes]) -> frozenset[str]:
    """The addresses named by the keys under the members prefix (others ignored)."""
    head = members_prefix(prefix)
    return frozenset(key[len(head):].decode() for key in keys if key.startswith(head) and len(key) > len(head))


class ReplicaMembers:
    """This replica's membership key, and the live replicas as last seen (`live`)."""

    def __init__(self, client: aetcd.Client, prefix: str, address: str, *, ttl_s: int = 2,
                 poll_s: float = POLL_S, is_ready: Callable[[], bool] = lambda: True) -> None:
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
        self.live: frozenset[str] = frozenset({address})
        self.changed = asyncio.Event()  # set whenever `live` changes (the shard re-checks its nodes)

    async def run(self) -> None:
        """Keeps our key alive and `live` current until cancelled; our key is revoked on the way out."""
        lease_id = 0
        next_refresh = 0.0
        loop = asyncio.get_running_loop()
        try:
            while True:
                now = loop.time()
                if now >= next_refresh and (lease_id or self._is_ready()):
                    lease_id, next_refresh = await self._keep(lease_id, now)
                await self._poll()
                await asyncio.sleep(self._poll_s)
        finally:
            if lease_id:
                with contextlib.suppress(Exception):
                    await within(self._client.revoke_lease(lease_id), self._timeout_s)

    async def _keep(self, lease_id: int, now: float) -> tuple[int, float]:
        """Refreshes our lease (or takes a new one and puts our key); the next refresh time."""
        try:
            if lease_id:
                reply = await within(self._client.refresh_lease(lease_id), self._timeout_s)
                if reply is not None and int(reply.TTL) > 0:
                    return lease_id, now + self._ttl_s / 3
            lease = await within(self._client.lease(self._ttl_s), self._timeout_s)
            await within(self._client.put(self._key, b"", lease=lease.id), self._timeout_s)
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
