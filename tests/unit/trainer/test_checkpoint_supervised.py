"""ftsup.checkpoint.supervised: a rank's shard write and read under the supervisor, one process."""

from __future__ import annotations

import hashlib

import pytest

from ftsup.checkpoint import catalog, supervised
from ftsup.checkpoint.errors import CheckpointError, StoreUnavailable
from ftsup.checkpoint.local import LocalDirStore
from ftsup.checkpoint.manifest import Layout
from ftsup.common import checkpoint_ids

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
L = Layout("")
CID = checkpoint_ids.checkpoint_id_for(4, 1)


class UnavailableStore(LocalDirStore):
    """A store whose data uploads give up, as S3Store does once its retry deadline is spent."""

    def put_many(self, items):
        raise StoreUnavailable("put '__0_0.distcp' on s3://b at http://proxy: gave up after 7 attempts in 3.0s")


def test_a_failed_shard_write_raises_a_checkpoint_error_not_dcps_base_exception(tmp_path):
    store = UnavailableStore(tmp_path)
    payload = b"payload"
    with pytest.raises(StoreUnavailable, match=r"writing checkpoint 'step-0000000004-g1' failed: rank 0:"
                                               r" StoreUnavailable: .*gave up after 7 attempts") as caught:
        supervised.save_rank(store, L, CID, 0, payload, hashlib.sha256(payload).hexdigest())
    assert isinstance(caught.value, Exception)  # callers' `except Exception` reports it; DCP's would escape
    store.close()


def test_a_written_shard_reads_back_after_its_commit(tmp_path):
    store = LocalDirStore(tmp_path)
    payload = b"\x01" * 1000
    sha = hashlib.sha256(payload).hexdigest()
    report = supervised.save_rank(store, L, CID, 0, payload, sha)
    catalog.commit(store, L, CID, 4, [report], supervised.job_topology(1), supervised.JOB_VERSIONS)
    assert supervised.load_rank(store, L, CID, 0, 1) == (payload, sha)
    store.delete([L.data_key(CID, "__0_0.distcp")])
    with pytest.raises(CheckpointError, match="reading rank 0 of checkpoint 'step-0000000004-g1' failed"):
        supervised.load_rank(store, L, CID, 0, 1)
    store.close()


def test_a_grown_elastic_world_borrows_a_saved_ranks_shard_and_others_are_refused(tmp_path):
    from ftsup.checkpoint.errors import ReshardRefused

    store = LocalDirStore(tmp_path)
    payload = b"\x02" * 100
    sha = hashlib.sha256(payload).hexdigest()
    report = supervised.save_rank(store, L, CID, 0, payload, sha)
    catalog.commit(store, L, CID, 4, [report], supervised.job_topology(1), supervised.JOB_VERSIONS)
    # Saved by a world of 1 (shrunk), read by rank 3 of a world of 4 (grown back): replicated state.
    assert supervised.load_rank(store, L, CID, 3, 4, replicated=True) == (payload, sha)
    with pytest.raises(ReshardRefused, match="rank 3 has no shard"):
        supervised.load_rank(store, L, CID, 3, 4)
    store.close()
