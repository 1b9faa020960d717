"""Full garbage collections on a large, long-lived heap: what survives one is frozen out of the next.

CPython's cyclic collector walks every object it tracks in a full (generation 2) collection, and
starts one whenever the long-lived heap has grown by a quarter since the last. A link shard holding
6,250 agents' streams keeps those streams' objects for as long as the agents live; every training
step's burst of reports promotes enough new objects to start another full collection, and each
walked the whole heap: 0.5-1.4 s of wall time on a busy 2-core machine, once per 10 s step, during
which the shard read no agent stream (issue 14, part 19: the shards' loop stalls over 1 s, the
control plane's p99 latency, and nodes heard seconds late).

So after each full collection the young generations are collected and what survives is frozen
(`gc.freeze`: moved to a generation the collector never walks; O(1)), and the next full
collection walks only what arrived since. A frozen object that dies is still freed by reference
counting, which is how nearly all of them die; only cycles of garbage among frozen objects wait,
until every `refreeze_s` the frozen heap is thawed (`gc.unfreeze`) and collected once: one walk
of the whole heap, the cost of every collection before, every ten minutes instead of every step.
(Freezing without the young collection first measured worse: three runs of four had 22-75 nodes
suspected after their agents' writes waited ~3 s on one shard, the cause not found; a step's
garbage cycles holding gRPC's buffers until the thaw is the likeliest.)

It is off by default (`--gc-refreeze-s 0`: the pauses are reported, nothing is frozen), because
it is not yet proven on this machine: it ended the shards' stalls over 1 s in all three runs with it,
but the one run of its final form that also killed a shard saw 434 deaths after the kill, in a run
whose load generator sent half the heartbeats due, all of them late (issue 14, part 19).

The collector's callback only notes what happened (it may run inside any allocation, of any thread,
holding any lock): the freeze and the pauses' metric are done by `tick`, from the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from collections.abc import Callable
from typing import Any

TICK_S = 0.1  # how soon after a full collection its survivors are frozen
REFREEZE_S = 600.0  # how often the frozen heap is thawed and collected (its garbage cycles freed)
PAUSES_KEPT = 1_024  # collections noted between two ticks at most (the oldest are dropped)


class GcPacer:
    """Installed once per process (`install`), ticked from its event loop (`tick`), `close`d at exit."""

    def __init__(self, *, refreeze_s: float = REFREEZE_S, clock: Callable[[], float] = time.monotonic,
                 on_pause: Callable[[int, float], None] | None = None) -> None:
        self._refreeze_s = refreeze_s
        self._clock = clock
        self._on_pause = on_pause  # (generation, seconds) of each collection, from `tick`
        self._started_s = 0.0
        self._pauses: collections.deque[tuple[int, float]] = collections.deque(maxlen=PAUSES_KEPT)
        self._full_since_tick = False
        self._thawed_at = clock()
        self._installed = False
        self.freezes = 0  # (a counter, for tests and logs)
        self.thaws = 0

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def close(self) -> None:
        """Stops pacing and thaws the frozen heap (the collector walks it again)."""
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False
        gc.unfreeze()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # (inside the collector: plain attribute writes and a deque append only)
        if phase == "start":
            self._started_s = time.perf_counter()
            return
        generation = info.get("generation", 0)
        self._pauses.append((generation, time.perf_counter() - self._started_s))
        if generation == 2:
            self._full_since_tick = True

    async def run(self, every_s: float = TICK_S) -> None:
        """Ticks until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            self.tick()

    def tick(self) -> None:
        """From the event loop, often (every 0.1 s): reports the collections since the last tick,
        freezes what survived a full one, and every `refreeze_s` thaws and collects the frozen heap."""
        while self._pauses:
            generation, seconds = self._pauses.popleft()
            if self._on_pause is not None:
                self._on_pause(generation, seconds)
        if not self._full_since_tick or not self._refreeze_s:  # (0: pauses reported, nothing frozen)
            return
        self._full_since_tick = False
        now = self._clock()
        if now - self._thawed_at >= self._refreeze_s:
            self._thawed_at = now
            self.thaws += 1
            gc.unfreeze()
            gc.collect()  # (a full collection: the next tick freezes what survives it)
            return
        # The young generations are collected first: a cycle that died since the full collection (a
        # stream's buffers among them) is freed now, not frozen until the thaw. Frozen with the
        # rest, such garbage went with runs whose agents' writes waited ~3 s (issue 14, part 19).
        gc.collect(1)
        gc.freeze()
        self.freezes += 1
