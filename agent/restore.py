"""Per-rank restore state of the current generation: what GetRestore hands each trainer.

The launcher starts trainer processes at once (their `import torch` takes seconds) and calls
`begin`, which resolves every rank's snapshot concurrently: from this node's store, or fetched
from a peer (streamed into the store, verified as it lands). `get` blocks a trainer until its
rank is resolved. Outcomes are plain values, never exceptions left in futures, so nothing is lost
if no trainer asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import structlog

from ftsup.agent.peers import PeerClient, PeerUnavailable, SnapshotMissing
from ftsup.agent.snapshots import Blob, InvalidSnapshot, SnapshotMemoryFull, SnapshotStore
from ftsup.v1 import events_pb2

Logger = structlog.typing.FilteringBoundLogger


@dataclass(frozen=True, slots=True)
class RestoreSource:
    rank: int
    kind: int  # events_pb2.RestoreKind
    source_node_id: str
    source_address: str
    source_rank: int | None = None  # another rank's snapshot (an elastic job's replicated state)


@dataclass(frozen=True, slots=True)
class Outcome:
    blob: Blob | None  # None with no error: start fresh (or from a checkpoint, the trainer's job)
    error: str | None = None


class RestoreUnavailable(Exception):
    """The rank's restore failed; the message says why (GetRestore maps it to FAILED_PRECONDITION)."""


class UnknownRank(Exception):
    """GetRestore asked about a rank or generation this node is not running (INVALID_ARGUMENT)."""


class RestoreBook:
    def __init__(self, node_id: str, store: SnapshotStore, peers: PeerClient, log: Logger) -> None:
        self._node_id = node_id
        self._store = store
        self._peers = peers
        self._log = log
        self._generation = 0
        self._outcomes: dict[int, asyncio.Future[Outcome]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def begin(
        self, generation: int, ranks: Iterable[int], restore_step: int | None, sources: Iterable[RestoreSource]
    ) -> None:
        """Starts resolving every rank of `generation`; replaces the previous generation's book."""
        self.cancel()
        self._generation = generation
        by_rank = {source.rank: source for source in sources}
        loop = asyncio.get_running_loop()
        for rank in ranks:
            future: asyncio.Future[Outcome] = loop.create_future()
            self._outcomes[rank] = future
            if restore_step is None:
                future.set_result(Outcome(None))
                continue
            task = asyncio.create_task(self._resolve(future, rank, restore_step, by_rank.get(rank)))
            self._tasks.append(task)

    async def _resolve(
        self, future: asyncio.Future[Outcome], rank: int, step: int, source: RestoreSource | None
    ) -> None:
        try:
            outcome = await self._obtain(rank, step, source)
        except Exception as exc:
            outcome = Outcome(None, f"restore of rank {rank} step {step} failed: {exc}")
        if not future.done():  # first: a trainer waits on it, whatever happens to the log line below
            future.set_result(outcome)
        if outcome.error:
            self._log.error("restore_failed", generation=self._generation, rank=rank, step=step, reason=outcome.error)
        else:
            self._log.info("restore_ready", generation=self._generation, rank=rank, step=step,
                           has_state=outcome.blob is not None)

    async def _obtain(self, rank: int, step: int, source: RestoreSource | None) -> Outcome:
        kind = source.kind if source is not None else events_pb2.RESTORE_KIND_LOCAL_SNAPSHOT
        if kind in (events_pb2.RESTORE_KIND_FRESH, events_pb2.RESTORE_KIND_CHECKPOINT):
            # Fresh start, or the trainer loads the checkpoint at FTSUP_RESTORE_STEP itself.
            return Outcome(None)
        if source is not None and source.source_rank is not None:
            rank = source.source_rank  # replicated state: that rank's copy is this rank's state
        held = self._store.get(rank, step)
        if held is not None:
            return Outcome(held)
        if kind == events_pb2.RESTORE_KIND_LOCAL_SNAPSHOT:
            return Outcome(None, f"snapshot of rank {rank} step {step} is not held by node {self._node_id}")
        if kind != events_pb2.RESTORE_KIND_PEER_SNAPSHOT:
            return Outcome(None, f"unknown restore kind {kind} for rank {rank}")
        assert source is not None
        if not source.source_address:
            return Outcome(None, f"peer restore of rank {rank} names no source address")
        try:
            # Streamed into the store: verified as it lands, held once whole.
            blob = await self._peers.fetch(source.source_address, rank, step, self._store, generation=self._generation,
                                           node_id=source.source_node_id)
        except (PeerUnavailable, SnapshotMissing, InvalidSnapshot, SnapshotMemoryFull) as exc:
            return Outcome(None, f"fetch from {source.source_node_id or '?'} ({source.source_address}): {exc}")
        return Outcome(blob)

    async def get(self, rank: int, generation: int) -> Blob | None:
        """Waits for the rank's outcome; raises UnknownRank or RestoreUnavailable."""
        if generation != self._generation:
            raise UnknownRank(f"generation {generation} is not running on node {self._node_id} (running {self._generation})")
        future = self._outcomes.get(rank)
        if future is None:
            raise UnknownRank(f"rank {rank} is not run by node {self._node_id} in generation {generation}")
        outcome = await asyncio.shield(future)
        if outcome.error is not None:
            raise RestoreUnavailable(outcome.error)
        return outcome.blob

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        for future in self._outcomes.values():
            if not future.done():
                future.set_result(Outcome(None, f"generation {self._generation} was replaced"))
        self._tasks.clear()
        self._outcomes.clear()
