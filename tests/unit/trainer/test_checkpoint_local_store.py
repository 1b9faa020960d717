"""LocalDirStore, the embedded default, against the ObjectStore contract (plus its own atomicity rules)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import pytest

from ftsup.checkpoint.errors import ObjectExists, StoreError
from ftsup.checkpoint.local import LocalDirStore
from tests.support.objectstore_contract import SMALL_CHUNKING, ObjectStoreContract


class TestLocalDirStoreContract(ObjectStoreContract):
    @pytest.fixture
    def store(self, tmp_path) -> Iterator[LocalDirStore]:
        store = LocalDirStore(tmp_path / "store", chunking=SMALL_CHUNKING)
        yield store
        store.close()

    @pytest.fixture
    def abandon(self, store: LocalDirStore):
        return lambda key: _die_mid_put(store, key)


def _die_mid_put(store: LocalDirStore, key: str) -> None:
    """What a writer killed between writing its temp file and the rename leaves behind."""
    real_replace = os.replace

    def killed(src, dst):
        raise KeyboardInterrupt("killed before the rename")

    os.replace = killed
    try:
        store.put(key, b"x" * 1000)
    except KeyboardInterrupt:
        pass
    finally:
        os.replace = real_replace


def test_a_failed_put_leaves_neither_a_partial_object_nor_a_temp_file(tmp_path, monkeypatch):
    store = LocalDirStore(tmp_path)
    real_write = os.write
    calls = []

    def write_half_then_fail(fd, data):  # the disk fills up after the first chunk
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, memoryview(data)[: len(data) // 2])

    monkeypatch.setattr(os, "write", write_half_then_fail)
    with pytest.raises(StoreError, match="ck/obj"):
        store.put("ck/obj", b"x" * 4096)
    monkeypatch.undo()
    assert len(calls) == 2
    assert store.list("") == ()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    store.close()


def test_put_if_absent_leaves_no_temp_file_when_it_loses(tmp_path):
    store = LocalDirStore(tmp_path)
    store.put_if_absent("ck/m", b"a")
    with pytest.raises(ObjectExists):
        store.put_if_absent("ck/m", b"b")
    assert sorted(os.listdir(tmp_path / "ck")) == ["m"]
    store.close()
