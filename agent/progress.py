"""Per-rank step progress of the running generation, as the trainer link sees it.

Fed by ReportStep, read by the hang watcher; reset when a new generation starts. Times come
from the agent's monotonic clock, never from the trainer.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ftsup.agent.core.hang import Phase

WINDOW = 32
MAX_EARLY = 1024  # attachments remembered ahead of the watcher's generation switch


@dataclass(slots=True)
class RankProgress:
    started_s: float
    last_progress_s: float
    last_step: int = 0
    step_times_s: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=WINDOW))
    is_hang_reported: bool = False
    # Only ranks that use a Session are judged for hangs: a plain torchrun script (level 0)
    # never reports progress, so silence says nothing about it (issue 13).
    is_watched: bool = False
    phase: Phase | None = None  # the named phase it is in (level 1), None while training steps


class ProgressTracker:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._generation = 0
        self.ranks: dict[int, RankProgress] = {}
        # Ranks of a newer generation that attached before the watcher switched to it.
        self._early: set[tuple[int, int]] = set()

    @property
    def generation(self) -> int:
        return self._generation

    def start_generation(self, generation: int, ranks: tuple[int, ...]) -> None:
        now = self._clock()
        self._generation = generation
        self.ranks = {rank: RankProgress(started_s=now, last_progress_s=now,
                                         is_watched=(generation, rank) in self._early) for rank in ranks}
        self._early = {(g, r) for g, r in self._early if g > generation}

    def attach(self, generation: int, rank: int) -> None:
        progress = self.ranks.get(rank)
        if generation == self._generation and progress is not None:
            progress.is_watched = True
        elif generation > self._generation and len(self._early) < MAX_EARLY:
            self._early.add((generation, rank))

    def record_liveness(self, generation: int, rank: int, phase: Phase | None) -> None:
        """A heartbeat, or entering/leaving a phase: progress, and the limit that applies from now."""
        progress = self.ranks.get(rank)
        if generation != self._generation or progress is None:
            return
        progress.last_progress_s = self._clock()
        progress.phase = phase
        progress.is_hang_reported = False
        progress.is_watched = True

    def record_step(self, generation: int, rank: int, step: int, step_time_s: float) -> None:
        progress = self.ranks.get(rank)
        if generation != self._generation or progress is None:
            return
        progress.last_progress_s = self._clock()
        progress.last_step = step
        progress.step_times_s.append(step_time_s)
        progress.is_hang_reported = False
        progress.is_watched = True

    def now(self) -> float:
        return self._clock()
