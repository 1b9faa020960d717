"""The supervisor shell's part of object-store checkpoints: commit, abort and retention.

The core decides (start, shards written, committed or aborted); this shell does the store I/O
those decisions call for, off the event loop (asyncio.to_thread: a commit reads every shard
index back and HEADs every object), and posts each commit's outcome back as an input, so the
decision to record CheckpointCommitted or CheckpointAborted is the core's. After a commit the
newest `keep` checkpoints are kept (catalog.gc); an aborted attempt's objects are deleted.
Commit and abort of one checkpoint id never overlap (catalog.abort's own rule): an abort waits
for that id's commit to finish, then deletes what it wrote, its manifest included.
Credentials never pass through here: the store gets them from the environment (boto3's chain).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable

from ftsup.common import logs
from ftsup.supervisor.config import CheckpointSettings
from ftsup.supervisor.core import checkpoints
from ftsup.supervisor.core.events import CheckpointAborted, CheckpointCommitted, Record
from ftsup.supervisor.core.inputs import CheckpointCommitResult, Input
from ftsup.supervisor.core.state import ClusterState, PendingCheckpoint

log = logs.get("supervisor.checkpointer")


class Checkpointer:
    def __init__(self, settings: CheckpointSettings, post: Callable[[Input], None]) -> None:
        from ftsup.checkpoint.location import open_location

        self._settings = settings
        self._post = post
        self._store, self._layout = open_location(
            settings.location, endpoint_url=settings.endpoint_url or None, region=settings.region or None
        )
        self._committing: set[str] = set()
        self._commits: dict[str, asyncio.Task[None]] = {}  # commit in flight, per checkpoint id
        self._tasks: set[asyncio.Task[None]] = set()

    def after(self, state: ClusterState, records: Iterable[Record]) -> None:
        """Called by the runtime after it applied `records` (leader only)."""
        for record in records:
            event = record.event
            if isinstance(event, CheckpointAborted):
                self._spawn(self._abort(event.checkpoint_id, self._commits.get(event.checkpoint_id)))
            elif isinstance(event, CheckpointCommitted):
                self._committing.discard(event.checkpoint_id)
                self._spawn(self._gc(event.checkpoint_id))
        pending = state.pending_checkpoint
        if (pending is not None and pending.is_complete and pending.checkpoint_id not in self._committing
                and not checkpoints.is_commit_held(state)):  # an SDC check of its step may still fail it
            key = pending.checkpoint_id
            self._committing.add(key)
            task = self._spawn(self._commit(pending))
            self._commits[key] = task
            task.add_done_callback(lambda _: self._commits.pop(key, None))

    def _spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _commit(self, pending: PendingCheckpoint) -> None:
        from ftsup.checkpoint import catalog
        from ftsup.checkpoint.errors import CheckpointError
        from ftsup.checkpoint.manifest import ShardReport
        from ftsup.checkpoint.supervised import JOB_VERSIONS, job_topology

        reports = [ShardReport(r.shard, r.key, r.sha256, r.size_bytes) for r in pending.records]
        try:
            manifest, manifest_sha256 = await asyncio.to_thread(
                catalog.commit_pinned, self._store, self._layout, pending.checkpoint_id, pending.step, reports,
                job_topology(pending.shards), JOB_VERSIONS,
            )
        except (CheckpointError, ValueError, OSError) as exc:
            self._committing.discard(pending.checkpoint_id)
            log.warning("checkpoint commit failed", checkpoint_id=pending.checkpoint_id, generation=pending.generation,
                        step=pending.step, error=str(exc))
            self._post(CheckpointCommitResult(pending.checkpoint_id, pending.step, "", f"{type(exc).__name__}: {exc}"))
            return
        key = self._layout.manifest_key(manifest.checkpoint_id)
        self._post(CheckpointCommitResult(pending.checkpoint_id, pending.step, key, manifest_sha256=manifest_sha256))

    async def _abort(self, checkpoint_id: str, commit: asyncio.Task[None] | None = None) -> None:
        from ftsup.checkpoint import catalog
        from ftsup.checkpoint.errors import CheckpointError

        if commit is not None:  # a late manifest would otherwise outlive the objects it names
            await asyncio.wait({commit})
        self._committing.discard(checkpoint_id)
        try:
            deleted = await asyncio.to_thread(catalog.abort, self._store, self._layout, checkpoint_id)
        except (CheckpointError, OSError) as exc:  # gc removes it later
            log.warning("checkpoint abort failed", checkpoint_id=checkpoint_id, error=str(exc))
            return
        log.info("checkpoint attempt deleted", checkpoint_id=checkpoint_id, objects=deleted)

    async def _gc(self, checkpoint_id: str) -> None:
        from ftsup.checkpoint import catalog
        from ftsup.checkpoint.errors import CheckpointError

        try:
            plan = await asyncio.to_thread(catalog.gc, self._store, self._layout, self._settings.keep)
        except (CheckpointError, OSError) as exc:
            log.warning("checkpoint gc failed", after=checkpoint_id, error=str(exc))
            return
        log.info("checkpoint retention", kept=list(plan.kept), deleted=list(plan.delete_committed))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
