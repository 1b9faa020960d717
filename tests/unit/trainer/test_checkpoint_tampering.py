"""A restore refuses a bucket someone tampered with, before anything is unpickled.

The attacker can write the checkpoint prefix (a leaked trainer key, a compromised rank). Each
case plants a pickle that would create a marker file if it ever ran, and asserts both the clear
refusal and that the marker does not exist. Stores are real files (LocalDirStore); the S3 variant
runs in tests/integration/test_s3_checkpoint.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import pickle

import pytest
import torch.distributed.checkpoint as dcp

from ftsup.checkpoint import catalog, supervised
from ftsup.checkpoint.dcp import ObjectStoreWriter
from ftsup.checkpoint.errors import ObjectCorrupt
from ftsup.checkpoint.local import LocalDirStore
from ftsup.checkpoint.manifest import DCP_METADATA_NAME, Layout, decode_manifest, encode_manifest
from ftsup.checkpoint.store import ObjectInfo
from ftsup.checkpoint.verify import UntrustedCheckpoint
from ftsup.common import checkpoint_ids

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
L = Layout("ckpt")
CID = checkpoint_ids.checkpoint_id_for(4, 1)


class Payload:
    """Unpickling this runs open(marker, 'w'): the stand-in for arbitrary code."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _committed(store: LocalDirStore) -> tuple[bytes, str]:
    payload = b"\x07" * 512
    sha = hashlib.sha256(payload).hexdigest()
    report = supervised.save_rank(store, L, CID, 0, payload, sha)
    _, pin = catalog.commit_pinned(store, L, CID, 4, [report], supervised.job_topology(1), supervised.JOB_VERSIONS)
    return payload, pin


def _replace_object(store: LocalDirStore, name: str, body: bytes, *, rewrite_manifest: bool) -> None:
    """Put `body` at the object, and (the thorough attacker) a manifest that records its digest."""
    key = L.data_key(CID, name)
    store.delete([key])
    info = store.put(key, body)
    if rewrite_manifest:
        manifest = decode_manifest(bytes(store.get(L.manifest_key(CID))))
        objects = tuple(info if o.key == key else o for o in manifest.objects)
        store.delete([L.manifest_key(CID)])
        store.put(L.manifest_key(CID), encode_manifest(dataclasses.replace(manifest, objects=objects)))


def test_the_pinned_manifest_restores_and_the_pin_is_its_sha256(tmp_path: pathlib.Path):
    store = LocalDirStore(tmp_path)
    payload, pin = _committed(store)
    assert pin == hashlib.sha256(bytes(store.get(L.manifest_key(CID)))).hexdigest()
    assert supervised.load_rank(store, L, CID, 0, 1, manifest_sha256=pin)[0] == payload


@pytest.mark.parametrize("target", ["metadata", "shard"])
def test_a_consistently_replaced_manifest_and_object_is_refused_by_the_pin(tmp_path: pathlib.Path, target: str):
    store = LocalDirStore(tmp_path / "store")
    _, pin = _committed(store)
    marker = tmp_path / "pwned"
    name = DCP_METADATA_NAME if target == "metadata" else "__0_0.distcp"
    _replace_object(store, name, pickle.dumps(Payload(marker)), rewrite_manifest=True)
    with pytest.raises(UntrustedCheckpoint, match=r"MANIFEST.json' has SHA-256 [0-9a-f]{64}, but the committed"
                                                  rf" record pins {pin}"):
        supervised.load_rank(store, L, CID, 0, 1, manifest_sha256=pin)
    assert not marker.exists()


@pytest.mark.parametrize("target", ["metadata", "shard"])
def test_an_object_that_differs_from_the_manifest_is_refused_before_it_is_deserialized(
    tmp_path: pathlib.Path, target: str
):
    store = LocalDirStore(tmp_path / "store")
    _, pin = _committed(store)
    marker = tmp_path / "pwned"
    name = DCP_METADATA_NAME if target == "metadata" else "__0_0.distcp"
    _replace_object(store, name, pickle.dumps(Payload(marker)), rewrite_manifest=False)
    with pytest.raises(ObjectCorrupt, match=rf"{name}' read from .* SHA-256 .*; the manifest records"):
        supervised.load_rank(store, L, CID, 0, 1, manifest_sha256=pin)
    assert not marker.exists()


def _poisoned_commit(store: LocalDirStore, state: dict) -> str:
    """A compromised rank writes a poisoned checkpoint and reports it honestly: the commit records
    its real digests, so only the restricted unpicklers stand between it and every rank."""
    writer = ObjectStoreWriter(store, L, CID)
    dcp.save(state, storage_writer=writer, no_dist=True)
    report = catalog.write_shard_index(store, L, writer.shard_index())
    _, pin = catalog.commit_pinned(store, L, CID, 4, [report], supervised.job_topology(1), supervised.JOB_VERSIONS)
    return pin


def test_a_committed_byte_item_that_would_run_code_is_refused_by_the_weights_only_load(tmp_path: pathlib.Path):
    store = LocalDirStore(tmp_path / "store")
    marker = tmp_path / "pwned"
    pin = _poisoned_commit(store, {"rank-00000-payload": Payload(marker), "rank-00000-sha256": "x"})
    with pytest.raises(UntrustedCheckpoint, match="rank-00000-payload.*needs an unrestricted unpickle"):
        supervised.load_rank(store, L, CID, 0, 1, manifest_sha256=pin)
    assert not marker.exists()


def test_committed_dcp_metadata_naming_foreign_code_is_refused(tmp_path: pathlib.Path):
    store = LocalDirStore(tmp_path / "store")
    marker = tmp_path / "pwned"
    pin = _poisoned_commit(store, {"rank-00000-payload": b"p", "rank-00000-sha256": "x"})
    # The coordinator itself wrote a poisoned .metadata before the commit recorded its digest.
    _replace_object(store, DCP_METADATA_NAME, pickle.dumps(Payload(marker)), rewrite_manifest=True)
    pin = hashlib.sha256(bytes(store.get(L.manifest_key(CID)))).hexdigest()
    with pytest.raises(UntrustedCheckpoint, match=r"DCP metadata names io.open, which is not part of DCP metadata"):
        supervised.load_rank(store, L, CID, 0, 1, manifest_sha256=pin)
    assert not marker.exists()


def test_a_malformed_pin_in_the_environment_is_refused():
    with pytest.raises(ValueError, match="not a manifest SHA-256"):
        supervised.CheckpointEnv.from_mapping({"FTSUP_RESTORE_CHECKPOINT_SHA256": "abc"})


def test_objectinfo_is_unchanged():  # the manifest's per-object record the reader checks against
    assert [f.name for f in dataclasses.fields(ObjectInfo)] == ["key", "size_bytes", "sha256"]
