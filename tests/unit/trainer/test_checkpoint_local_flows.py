"""Save, commit, load, abort and gc on the embedded LocalDirStore (one process, no server)."""

from __future__ import annotations

import json
import os
import time
import warnings

import pytest
import torch

from ftsup.checkpoint import catalog, flows
from ftsup.checkpoint.errors import CheckpointNotCommitted, ManifestExists, ObjectCorrupt, StoreUnavailable
from ftsup.checkpoint.local import LocalDirStore
from ftsup.checkpoint.manifest import Layout, Topology, Versions, checkpoint_id_for
from ftsup.checkpoint.policy import RestoreMode

V = Versions("data-1", "tok-1")
ONE = Topology(1, 1)
L = Layout("ckpts")

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state(seed: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(31, 17, generator=gen), "h": torch.randn(5, generator=gen).to(torch.float16),
            "mask": torch.tensor([True, False, True]), "empty": torch.empty(0, 3), "scalar": torch.tensor(2.5),
            "step": seed, "meta": {"lr": 0.1 * seed}}


def blank(sd: dict[str, object]) -> dict[str, object]:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else blank(v) if isinstance(v, dict) else None
            for k, v in sd.items()}


@pytest.fixture
def store(tmp_path):
    store = LocalDirStore(tmp_path / "store")
    yield store
    store.close()


def test_save_then_load_is_bit_exact_and_direct(store):
    cid = checkpoint_id_for(3, "a")
    manifest = flows.save(state(3), store, L, cid, 3, ONE, V)
    assert manifest.step == 3 and manifest.topology == ONE and manifest.versions == V
    loaded = blank(state(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = flows.load(store, L, cid, loaded, ONE, V)
    assert plan.mode is RestoreMode.DIRECT
    for key, value in state(3).items():
        if isinstance(value, torch.Tensor):
            assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
        else:
            assert loaded[key] == value, key


def test_a_second_commit_is_the_first_one_when_it_names_the_same_shards_and_refused_otherwise(store):
    # A new leader after a failover commits again what its predecessor committed: that must be
    # recognised as the same commit (else it would be recorded as aborted while its manifest
    # stands); a commit naming other shards is refused. The manifest is never rewritten.
    cid = checkpoint_id_for(4, "a")
    manifest = flows.save(state(4), store, L, cid, 4, ONE, V)
    body = store.get(L.manifest_key(cid))
    assert catalog.commit(store, L, cid, 4, list(manifest.shards), ONE, V) == manifest
    with pytest.raises(ManifestExists, match="never overwritten"):  # another commit under this id
        catalog.commit(store, L, cid, 5, list(manifest.shards), ONE, V)
    assert store.get(L.manifest_key(cid)) == body and catalog.read_manifest(store, L, cid) == manifest


def test_a_corrupted_object_is_caught_on_load(store):
    cid = checkpoint_id_for(5, "a")
    flows.save(state(5), store, L, cid, 5, ONE, V)
    path = store.root / L.data_key(cid, "__0_0.distcp")
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ObjectCorrupt, match="__0_0.distcp.*the manifest records"):
        flows.load(store, L, cid, blank(state(5)), ONE, V)


def test_abort_removes_an_attempt_and_retracts_a_manifest_written_for_it(store):
    attempt = checkpoint_id_for(6, "x")
    store.put(L.data_key(attempt, "__0_0.distcp"), b"partial")
    assert catalog.abort(store, L, attempt) == 1
    assert store.list(L.directory(attempt)) == ()
    with pytest.raises(CheckpointNotCommitted):
        catalog.read_manifest(store, L, attempt)
    # The supervisor decided against a commit whose manifest was already written (an SDC-tainted
    # step, a step no newer than the last commit): the log says aborted, so the store must not show it.
    cid = checkpoint_id_for(7, "a")
    flows.save(state(7), store, L, cid, 7, ONE, V)
    assert catalog.abort(store, L, cid) == 4  # manifest, DCP metadata, the rank's object, its shard index
    assert catalog.list_committed(store, L) == () and store.list(L.root()) == ()


class LostManifestAnswer(LocalDirStore):
    """The manifest lands, but its answer never comes back within the retry deadline."""

    def put_if_absent(self, key, data):
        super().put_if_absent(key, data)
        raise StoreUnavailable(f"put {key!r}: gave up after 9 attempts in 120.0s (deadline 120.0s): read timeout")


def test_a_save_whose_manifest_landed_after_its_answer_was_lost_fails_with_no_manifest_left(tmp_path):
    store = LostManifestAnswer(tmp_path)
    cid = checkpoint_id_for(8, "lost")
    with pytest.raises(flows.CheckpointWriteFailed, match="not committed, attempt aborted"):
        flows.save(state(8), store, L, cid, 8, ONE, V)
    assert catalog.list_committed(store, L) == ()  # the caller was told "not committed": readers agree
    assert store.list(L.root()) == ()
    store.close()


def test_gc_never_deletes_a_checkpoint_whose_manifest_it_cannot_read(store):
    """A manifest of a newer format (or one damaged in place) is not proof of an abandoned attempt."""
    old, new = checkpoint_id_for(1, "v2"), checkpoint_id_for(5, "a")
    flows.save(state(1), store, L, old, 1, ONE, V)
    body = json.loads(bytes(store.get(L.manifest_key(old))))
    store.delete([L.manifest_key(old)])
    store.put_if_absent(L.manifest_key(old), json.dumps({**body, "format_version": 2}).encode())
    flows.save(state(5), store, L, new, 5, ONE, V)
    plan = catalog.gc(store, L, keep_last=1)
    assert plan.delete_incomplete == ()
    assert store.list(L.manifest_key(old)) == (L.manifest_key(old),)
    assert [m.checkpoint_id for m in catalog.list_committed(store, L)] == [new]


def test_gc_keeps_the_last_k(store):
    ids = [checkpoint_id_for(s, "a") for s in (1, 2, 3)]
    for step, cid in zip((1, 2, 3), ids, strict=True):
        flows.save(state(step), store, L, cid, step, ONE, V)
    plan = catalog.gc(store, L, keep_last=1)
    assert plan.delete_committed == tuple(ids[:2])
    assert [m.checkpoint_id for m in catalog.list_committed(store, L)] == [ids[2]]
    assert {L.checkpoint_of(k) for k in store.list(L.root())} == {ids[2]}


def test_gc_removes_temp_files_of_crashed_writers_once_old_and_not_of_a_checkpoint_in_flight(store):
    cid = checkpoint_id_for(3, "a")
    flows.save(state(3), store, L, cid, 3, ONE, V)
    crashed, flying = checkpoint_id_for(2, "crashed"), checkpoint_id_for(5, "flying")
    leftovers = {}
    for attempt in (crashed, flying):
        directory = store.root / L.directory(attempt)
        directory.mkdir(parents=True)
        leftovers[attempt] = directory / ".ftsup-tmp-0123abcd"  # what a writer killed before its rename leaves
        leftovers[attempt].write_bytes(b"half")
    hour_ago = time.time() - 3601
    for path in leftovers.values():
        os.utime(path, (hour_ago, hour_ago))
    assert store.list(L.root()) == tuple(sorted(store.list(L.directory(cid))))  # temp files are not objects

    dry = catalog.gc(store, L, keep_last=1, in_flight=frozenset({flying}), dry_run=True)
    assert [u.key for u in dry.aborted_uploads] == [L.directory(crashed) + ".ftsup-tmp-0123abcd"]
    assert all(p.exists() for p in leftovers.values())

    plan = catalog.gc(store, L, keep_last=1, in_flight=frozenset({flying}))
    assert [u.key for u in plan.aborted_uploads] == [L.directory(crashed) + ".ftsup-tmp-0123abcd"]
    assert not leftovers[crashed].exists() and not leftovers[crashed].parent.exists()
    assert leftovers[flying].exists()  # in flight: its writer may still rename it into place
    landed = catalog.gc(store, L, keep_last=1)  # its attempt no longer in flight: an hour old, stale
    assert [u.key for u in landed.aborted_uploads] == [L.directory(flying) + ".ftsup-tmp-0123abcd"]
    assert [m.checkpoint_id for m in catalog.list_committed(store, L)] == [cid]


def test_gc_leaves_a_young_temp_file_alone(store):
    directory = store.root / L.directory(checkpoint_id_for(4, "writing"))
    directory.mkdir(parents=True)
    (directory / ".ftsup-tmp-live").write_bytes(b"being written")
    plan = catalog.gc(store, L, keep_last=1)
    assert plan.aborted_uploads == ()
    assert [v.is_stale for v in plan.uploads] == [False] and "younger than 3600s" in plan.uploads[0].reason
    assert (directory / ".ftsup-tmp-live").exists()
    later = catalog.gc(store, L, keep_last=1, now_unix_s=time.time() + 3600)
    assert len(later.aborted_uploads) == 1 and not directory.exists()


def test_abort_upload_refuses_a_key_that_is_an_object(store):
    from ftsup.checkpoint.store import PendingUpload

    store.put("ck/obj", b"x")
    with pytest.raises(ValueError, match="not a pending upload"):
        store.abort_upload(PendingUpload("ck/obj", "obj", 0.0))
    assert bytes(store.get("ck/obj")) == b"x"
