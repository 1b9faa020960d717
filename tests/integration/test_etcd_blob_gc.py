"""Orphaned out-of-line blobs of the etcd log are collected, and never one a record points at.

On the real 3-member etcd (tests/conftest.py). Chunks are made small (1 KiB) so that a few-KiB
record goes out of line, as a 12,500-node GenerationStarted does at the default sizes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aetcd
import pytest
from aetcd import transactions as tx

from ftsup.supervisor.core.events import NodeCleared
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.api import LogUnavailable
from ftsup.supervisor.eventlog.etcd import EtcdLog, make_client
from ftsup.supervisor.eventlog.etcd_blobs import Pointer
from tests.support.async_wait import eventually
from tests.support.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.integration

SMALL = {"op_timeout_s": 5.0, "chunk_bytes": 1024, "max_txn_bytes": 64 * 1024}


@pytest.fixture
async def client(etcd: EtcdCluster) -> AsyncIterator[aetcd.Client]:
    client = make_client([m.client_url for m in etcd.members], timeout_s=5.0)
    yield client
    await client.close()


def big(i: int) -> NodeCleared:
    return NodeCleared(f"node-{i}", f"reason {i} " + "x" * 4000)  # ~4 KiB: four chunks


async def blob_shas(client: aetcd.Client, prefix: str) -> set[str]:
    root = f"{prefix}/blob/".encode()
    return {kv.key[len(root):].split(b"/", 1)[0].decode() for kv in await client.get_prefix(root)}


class _Unanswered:
    """The client, except that the next transaction goes to etcd (or not) and its answer is lost:
    an append whose outcome the writer never learns, as when etcd's reply times out."""

    def __init__(self, client: aetcd.Client, *, applied: bool) -> None:
        self._client = client
        self._applied = applied

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def transaction(self, *args: Any, **kwargs: Any) -> Any:
        if self._applied:
            await self._client.transaction(*args, **kwargs)
        raise TimeoutError("reply lost")


async def test_chunks_of_an_append_that_failed_after_writing_them_are_collected_not_the_committed_ones(
    client, etcd_prefix
) -> None:
    log = await EtcdLog.open(client, etcd_prefix, **SMALL)
    try:
        await log.append([big(1)], term=1, time_unix_s=1.0)
        committed = await blob_shas(client, etcd_prefix)
        assert len(committed) == 1, "the record went out of line"
        log._client = _Unanswered(client, applied=False)
        with pytest.raises(LogUnavailable):
            await log.append([big(2)], term=1, time_unix_s=2.0)
        log._client = client
        orphaned = await blob_shas(client, etcd_prefix) - committed
        assert len(orphaned) == 1, "the failed append left its chunks behind"

        assert await log.collect_garbage() == 0, "the first sighting only marks it"
        assert await log.collect_garbage() == 1
        assert await blob_shas(client, etcd_prefix) == committed
        assert await log.collect_garbage() == 0 and log.blobs_collected == 1

        await log.append([big(3)], term=1, time_unix_s=3.0)
        reader = await EtcdLog.open(client, etcd_prefix, **SMALL)
        assert [r.event for r in reader.read()] == [big(1), big(3)]
        await reader.aclose()
    finally:
        await log.aclose()


async def test_blobs_of_records_whose_compaction_was_cut_short_are_collected_by_the_next_leader(
    client, etcd_prefix
) -> None:
    old = await EtcdLog.open(client, etcd_prefix, **SMALL)
    try:
        await old.append([big(1)], term=1, time_unix_s=1.0)
        await old.append([NodeCleared("n", "small")], term=1, time_unix_s=2.0)
        await old.save_snapshot(ClusterState(applied_seq=2))

        async def dies(sha: str) -> None:
            raise LogUnavailable("the leader lost etcd (or its process) mid-compaction")

        old._delete_blob = dies  # type: ignore[method-assign]
        with pytest.raises(LogUnavailable):
            await old.compact()  # the records went; their blob did not
        assert len(await blob_shas(client, etcd_prefix)) == 1
    finally:
        await old.aclose()

    new = await EtcdLog.open(client, etcd_prefix, **SMALL)
    try:
        assert new.first_seq == 3
        await new.collect_garbage()
        assert await new.collect_garbage() == 1
        assert await blob_shas(client, etcd_prefix) == set()
    finally:
        await new.aclose()


async def test_a_collection_deletes_nothing_when_a_pointer_was_committed_after_it_looked(
    client, etcd_prefix
) -> None:
    """A slow writer commits a record pointing at a blob while a collection that already judged
    that blob orphaned (twice) is listing: the collection's transaction is refused (the head moved
    since its references were taken), and the record stays readable."""
    log = await EtcdLog.open(client, etcd_prefix, **SMALL)
    try:
        await log.append([NodeCleared("n", "small")], term=1, time_unix_s=1.0)
        log._client = _Unanswered(client, applied=False)
        with pytest.raises(LogUnavailable):
            await log.append([big(2)], term=1, time_unix_s=2.0)  # record 2's chunks, no pointer
        log._client = client
        (sha,) = await blob_shas(client, etcd_prefix)
        assert await log.collect_garbage() == 0  # marked

        chunks = [kv.value for kv in await client.get_prefix(f"{etcd_prefix}/blob/{sha}/".encode())]
        value = b"".join(chunks)
        pointer = Pointer(sha, len(value), len(chunks))
        listing = log._read_range

        async def listing_while_a_writer_commits(*args: Any, **kwargs: Any):
            await client.transaction([], [tx.Put(f"{etcd_prefix}/log/{2:020d}".encode(), pointer.encode()),
                                          tx.Put(f"{etcd_prefix}/head".encode(), b"2")], [])
            async for item in listing(*args, **kwargs):
                yield item

        log._read_range = listing_while_a_writer_commits  # type: ignore[method-assign]
        assert await log.collect_garbage() == 0, "the head moved after the references were taken"
        log._read_range = listing  # type: ignore[method-assign]
        assert await blob_shas(client, etcd_prefix) == {sha}
        reader = await EtcdLog.open(client, etcd_prefix, **SMALL)
        assert [r.event for r in reader.read()] == [NodeCleared("n", "small"), big(2)]
        await reader.aclose()
    finally:
        await log.aclose()


async def test_an_append_whose_chunks_a_collection_took_rewrites_them_and_commits_a_readable_record(
    client, etcd_prefix
) -> None:
    """A collection deletes the chunks between their writing and the commit (it judged them on an
    earlier look): the commit's chunk compares refuse it, the chunks are rewritten, and the record
    a reader resolves is whole."""
    log = await EtcdLog.open(client, etcd_prefix, **SMALL)
    store = log._store_blob
    taken = []

    async def store_then_collected(value: bytes):
        pointer = await store(value)
        if not taken:
            taken.append(pointer.sha256)
            await log._delete_blob(pointer.sha256)
        return pointer

    log._store_blob = store_then_collected  # type: ignore[method-assign]
    try:
        await log.append([big(1)], term=1, time_unix_s=1.0)
        assert taken and await blob_shas(client, etcd_prefix) == set(taken)
        reader = await EtcdLog.open(client, etcd_prefix, **SMALL)
        assert [r.event for r in reader.read()] == [big(1)]
        await reader.aclose()
    finally:
        await log.aclose()


async def test_a_writers_watch_reads_none_of_its_own_records_back_but_one_whose_answer_was_lost(
    client, etcd_prefix
) -> None:
    """The leader's own appends come back through its watch, usually before the transaction's
    answer: neither their chunks nor their records are read again (a 12,500-node
    GenerationStarted took ~1.4 s of the leader's loop to decode). An append whose answer was
    lost (LogUnavailable, yet committed) is read from the watch like anyone's record."""
    writer = await EtcdLog.open(client, etcd_prefix, **SMALL)
    follower = await EtcdLog.open(client, etcd_prefix, **SMALL)
    decoded: list[bytes] = []
    writer_records_of = writer._records_of

    def counted(key: bytes, value: bytes, stored: bytes) -> Any:
        decoded.append(key)
        return writer_records_of(key, value, stored)

    writer._records_of = counted  # type: ignore[method-assign]
    try:
        await writer.append([big(1)], term=1, time_unix_s=1.0)  # out of line: four chunks
        await writer.append([NodeCleared("node-2", "small")], term=1, time_unix_s=2.0)
        head = await client.get(writer._head_key)
        assert head is not None
        await eventually(lambda: writer._revision >= head.mod_revision and follower.head_seq == 2, 20.0, "watches lag")
        assert decoded == [], "the writer read its own records back"
        assert len(writer._record_blobs) == 1, "the writer still knows its record's blob"
        assert [r.event for r in follower.read()] == [big(1), NodeCleared("node-2", "small")]

        writer._client = _Unanswered(client, applied=True)
        with pytest.raises(LogUnavailable):
            await writer.append([big(3)], term=1, time_unix_s=3.0)
        writer._client = client
        await eventually(lambda: writer.head_seq == 3, 20.0, "the watch skipped a committed record whose answer was lost")
        assert [r.event for r in writer.read()] == [big(1), NodeCleared("node-2", "small"), big(3)]
        assert len(decoded) == 1 and writer._flight is None
    finally:
        await writer.aclose()
        await follower.aclose()


async def test_a_log_opened_on_an_empty_prefix_after_etcd_compacted_its_history_watches_without_reloading(
    client, etcd_prefix
) -> None:
    """An empty prefix has no key whose revision the watch could start after: it starts at the
    revision of the read that found it empty. (From revision 1 it failed on a compacted history
    and reloaded, a warning a second, until the log's first key appeared.)"""
    await client.put(f"{etcd_prefix}-elsewhere".encode(), b"1")
    now = (await client.get(f"{etcd_prefix}-elsewhere".encode())).mod_revision  # type: ignore[union-attr]
    await client.compact(now)
    reader = await EtcdLog.open(client, etcd_prefix, **SMALL)
    writer = await EtcdLog.open(client, etcd_prefix, **SMALL)
    try:
        assert reader._revision >= now
        await writer.append([NodeCleared("node-1", "first")], term=1, time_unix_s=1.0)
        await eventually(lambda: reader.head_seq == 1, 20.0, "the reader never saw the first record")
        assert reader.watch_restarts == 0 and writer.watch_restarts == 0
    finally:
        await reader.aclose()
        await writer.aclose()
