"""The ObjectStore contract: one suite every store must pass (LocalDirStore, S3Store).

A test module subclasses `ObjectStoreContract` and provides a `store` fixture whose keys live
under `prefix` (a fresh one per test, so a shared S3 bucket needs no cleanup between tests), and an
`abandon` fixture: a function that leaves an unfinished write of a key behind, as a writer killed
mid-put does (an S3 multipart upload with a part stored, a local temp file). The
chunking is small (5 MiB parts) so multipart behaviour is exercised with ~11 MiB objects.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable

import pytest

from ftsup.checkpoint import digest
from ftsup.checkpoint.errors import ObjectExists, ObjectNotFound
from ftsup.checkpoint.store import ObjectInfo, ObjectStore

SMALL_CHUNKING = digest.Chunking(multipart_threshold_bytes=5 * digest.MIB, part_size_bytes=5 * digest.MIB)


class ObjectStoreContract:
    @pytest.fixture
    def prefix(self) -> str:
        return f"contract-{os.urandom(6).hex()}"

    def test_put_then_get_returns_the_bytes_and_head_their_size_and_sha256(self, store: ObjectStore, prefix: str):
        data = os.urandom(1000)
        info = store.put(f"{prefix}/a", data)
        assert info == ObjectInfo(f"{prefix}/a", 1000, hashlib.sha256(data).hexdigest())
        assert bytes(store.get(f"{prefix}/a")) == data
        assert store.head(f"{prefix}/a") == info

    def test_put_replaces_an_existing_object(self, store: ObjectStore, prefix: str):
        store.put(f"{prefix}/a", b"old")
        store.put(f"{prefix}/a", b"new!")
        assert bytes(store.get(f"{prefix}/a")) == b"new!"
        assert store.head(f"{prefix}/a").size_bytes == 4

    def test_put_if_absent_never_overwrites(self, store: ObjectStore, prefix: str):
        first = store.put_if_absent(f"{prefix}/m", b"first")
        with pytest.raises(ObjectExists):
            store.put_if_absent(f"{prefix}/m", b"second")
        assert bytes(store.get(f"{prefix}/m")) == b"first"
        assert store.head(f"{prefix}/m") == first

    def test_missing_objects_raise_not_found(self, store: ObjectStore, prefix: str):
        with pytest.raises(ObjectNotFound):
            store.get(f"{prefix}/nothing")
        with pytest.raises(ObjectNotFound):
            store.head(f"{prefix}/nothing")

    def test_list_is_recursive_sorted_and_bounded_by_the_prefix(self, store: ObjectStore, prefix: str):
        for key in ("b/2", "a/1", "a/x/3", "ab/4"):
            store.put(f"{prefix}/{key}", b"x")
        assert store.list(f"{prefix}/a/") == (f"{prefix}/a/1", f"{prefix}/a/x/3")
        assert store.list(f"{prefix}/") == tuple(sorted(f"{prefix}/{k}" for k in ("b/2", "a/1", "a/x/3", "ab/4")))
        assert store.list(f"{prefix}-other/") == ()

    def test_delete_removes_objects_and_ignores_missing_ones(self, store: ObjectStore, prefix: str):
        store.put(f"{prefix}/a", b"1")
        store.put(f"{prefix}/d/b", b"2")
        store.delete([f"{prefix}/a", f"{prefix}/d/b", f"{prefix}/never"])
        assert store.list(f"{prefix}/") == ()
        with pytest.raises(ObjectNotFound):
            store.get(f"{prefix}/a")

    def test_a_large_object_is_stored_in_parts_with_a_composite_sha256(self, store: ObjectStore, prefix: str):
        assert store.chunking == SMALL_CHUNKING
        data = os.urandom(11 * digest.MIB + 123)  # 3 parts of 5, 5 and 1 MiB
        info = store.put(f"{prefix}/big", data)
        parts = [hashlib.sha256(data[a:a + 5 * digest.MIB]).digest() for a in range(0, len(data), 5 * digest.MIB)]
        assert info == ObjectInfo(f"{prefix}/big", len(data), hashlib.sha256(b"".join(parts)).hexdigest() + "-3")
        assert store.head(f"{prefix}/big") == info
        assert bytes(store.get(f"{prefix}/big")) == data

    def test_put_many_returns_infos_in_order_and_stores_every_object(self, store: ObjectStore, prefix: str):
        items = [(f"{prefix}/{i}", os.urandom(100 + i)) for i in range(6)] + [(f"{prefix}/big", os.urandom(6 * digest.MIB))]
        infos = store.put_many(items)
        assert [i.key for i in infos] == [k for k, _ in items]
        for (key, data), info in zip(items, infos, strict=True):
            assert info.size_bytes == len(data)
            assert info.sha256 == digest.object_digest(data, store.chunking)
            assert bytes(store.get(key)) == data

    def test_an_empty_object_round_trips(self, store: ObjectStore, prefix: str):
        info = store.put(f"{prefix}/empty", b"")
        assert info == ObjectInfo(f"{prefix}/empty", 0, hashlib.sha256(b"").hexdigest())
        assert bytes(store.get(f"{prefix}/empty")) == b""
        assert store.head(f"{prefix}/empty") == info

    @pytest.mark.parametrize("key", ["../escape", "/abs", "a//b", "a/./b", "", "sp ace"])
    def test_invalid_keys_are_rejected_naming_the_key(self, store: ObjectStore, key: str):
        with pytest.raises(ValueError, match="invalid object key"):
            store.put(key, b"x")

    def test_an_abandoned_write_is_an_upload_not_an_object_and_aborting_it_leaves_objects_alone(
            self, store: ObjectStore, prefix: str, abandon: Callable[[str], None]):
        store.put(f"{prefix}/ck/kept", b"stored")
        abandon(f"{prefix}/ck/big")
        abandon(f"{prefix}-other/ck/big")
        assert store.list(f"{prefix}/") == (f"{prefix}/ck/kept",)  # never visible as an object
        [upload] = store.list_uploads(f"{prefix}/")
        assert upload.key.startswith(f"{prefix}/ck/")
        assert abs(upload.initiated_unix_s - time.time()) < 600  # the server's clock, roughly ours
        store.abort_upload(upload)
        store.abort_upload(upload)  # already gone: fine
        assert store.list_uploads(f"{prefix}/") == ()
        assert bytes(store.get(f"{prefix}/ck/kept")) == b"stored"
        [other] = store.list_uploads(f"{prefix}-other/")
        store.abort_upload(other)
