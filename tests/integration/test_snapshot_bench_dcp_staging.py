"""DCP's async staging in `ftsup bench snapshot`, run for real (torch DCP, a file system writer)
under the stager behaviour of torch 2.11, the version on the GPU hosts."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_dcp_async_staging_runs_where_torch_closes_the_stager_after_each_stage(monkeypatch, tmp_path):
    """torch 2.11's DefaultStager closes its inner stager after every stage, emptying its copy
    table: a reused stager failed its second save `KeyError: <class 'type'>` on every GPU host."""
    from torch.distributed.checkpoint import staging

    from ftsup.bench import _snapshot_peers

    stage = staging.DefaultStager._stage

    def stage_then_close(self, state_dict, **kwargs):  # what torch 2.11 does
        staged = stage(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged

    monkeypatch.setattr(staging.DefaultStager, "_stage", stage_then_close)
    result = _snapshot_peers.run("dcp_async_save_async_staging", tmp_path, 1, 2, "cpu")
    assert result["ran"], result
    assert len(result["samples"]) == 2  # the warm-up save and two timed ones, each staged
