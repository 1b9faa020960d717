"""The checkpointer never aborts a checkpoint while its commit is still running (issue 16, item 11):
an abort that ran first would delete the objects a late manifest then names."""

from __future__ import annotations

import asyncio
import pathlib
import threading

from ftsup.checkpoint import catalog
from ftsup.supervisor.checkpointer import Checkpointer
from ftsup.supervisor.config import CheckpointSettings
from ftsup.supervisor.core.events import CheckpointAborted, Record
from ftsup.supervisor.core.state import ClusterState, PendingCheckpoint


async def test_an_abort_waits_for_the_same_checkpoints_commit_to_finish(tmp_path: pathlib.Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    order: list[str] = []
    commit_may_finish = threading.Event()
    commit_started = threading.Event()

    def slow_commit(*args: object, **kwargs: object) -> object:
        commit_started.set()
        assert commit_may_finish.wait(10)
        order.append("commit done")
        raise OSError("store went away")  # the outcome does not matter here, only the order

    def abort(store: object, layout: object, checkpoint_id: str) -> int:
        order.append(f"abort {checkpoint_id}")
        return 0

    monkeypatch.setattr(catalog, "commit_pinned", slow_commit)
    monkeypatch.setattr(catalog, "abort", abort)
    checkpointer = Checkpointer(CheckpointSettings(location=str(tmp_path)), post=lambda inp: None)
    pending = PendingCheckpoint("ck-1", generation=1, step=10, shards=1, written=(0,))
    checkpointer.after(ClusterState(pending_checkpoint=pending), [])
    assert await asyncio.to_thread(commit_started.wait, 10)
    checkpointer.after(ClusterState(), [Record(5, 1, 0.0, CheckpointAborted("ck-1", "step tainted by SDC"))])
    await asyncio.sleep(0.05)  # room for a wrongly concurrent abort to run; the order below is the test
    commit_may_finish.set()
    await asyncio.wait_for(asyncio.gather(*list(checkpointer._tasks)), 10)
    assert order == ["commit done", "abort ck-1"]
    assert checkpointer._commits == {}  # a finished commit is forgotten (its task's done callback)
