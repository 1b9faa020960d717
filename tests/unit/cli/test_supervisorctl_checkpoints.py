"""`supervisorctl checkpoints --json`: an optional field left unset reads as null, one set to 0 as 0
(step 0 is a real snapshot; absence means none yet)."""

from __future__ import annotations

from ftsup.supervisor.ctl.render_jobs import checkpoints_dict
from ftsup.v1 import operator_pb2


def test_unset_optional_fields_are_null_and_a_set_zero_is_zero() -> None:
    reply = operator_pb2.ListCheckpointsResponse(snapshot_step=0, snapshot_generation=3, checkpoint_id="ck-1")
    d = checkpoints_dict(reply)
    assert d["snapshot"] == {"step": 0, "generation": 3, "committed_unix_s": None}
    assert d["checkpoint"]["step"] is None and d["checkpoint"]["committed_unix_s"] is None
    assert d["interval"]["seconds"] is None


def test_nothing_committed_reads_as_no_snapshot_and_no_checkpoint() -> None:
    d = checkpoints_dict(operator_pb2.ListCheckpointsResponse(interval_s=120.0))
    assert d["snapshot"] is None and d["checkpoint"] is None
    assert d["interval"]["seconds"] == 120.0
