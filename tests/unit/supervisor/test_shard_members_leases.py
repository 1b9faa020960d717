"""A replica's membership lease is never left behind by a cancelled start: a lease granted for a
put that is cancelled (the replica stopping) is revoked, since `run()` never learned of it and the
key the put may have landed would otherwise stay a TTL, counted live by every other replica.
Pure (a stand-in for the etcd client): milliseconds."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from ftsup.supervisor.shard_members import ReplicaMembers


class _Etcd:
    """Grants leases; every put hangs (a loaded etcd) until the caller gives up."""

    def __init__(self) -> None:
        self.granted: list[int] = []
        self.revoked: list[int] = []
        self.putting = asyncio.Event()

    async def lease(self, ttl: int) -> Any:
        self.granted.append(100 + len(self.granted))
        return SimpleNamespace(id=self.granted[-1], TTL=ttl)

    async def put(self, key: bytes, value: bytes, lease: int) -> None:
        self.putting.set()
        await asyncio.Event().wait()

    async def revoke_lease(self, lease_id: int) -> None:
        self.revoked.append(lease_id)

    async def get_prefix(self, prefix: bytes, keys_only: bool = False) -> list[Any]:
        return []


async def test_a_lease_granted_for_a_put_cancelled_midway_is_revoked() -> None:
    etcd = _Etcd()
    members = ReplicaMembers(etcd, "/p", "a:1", ttl_s=30)  # type: ignore[arg-type]
    runner = asyncio.create_task(members.run())
    await asyncio.wait_for(etcd.putting.wait(), 5)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert etcd.granted == [100] and etcd.revoked == [100]
