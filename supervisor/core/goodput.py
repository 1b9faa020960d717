"""Goodput accounting: how much of the wall time went into training steps that survived, and
where the rest went. Derived from the event log alone (records and their append times).

Pure and stdlib-only: `GoodputAccount` folds records one at a time (the operator service keeps one
and feeds it new records as they are appended), `report(now_unix_s)` reads it. Every second of
wall time, from the first GenerationStarted (or the first record of a compacted log's window)
until now or the job's completion, lands in exactly one bucket:

- productive: a running generation making steps that no later restore threw away;
- detection: the culprit had already failed but no verdict was given yet (the `silent_for_s`
  of the GenerationEnded, or of the NodeDeclaredDead before it in older logs);
- lost work: steps made after the restore point the next generation went back to: the time
  between that point's commit and the failure, interpolated by step within a generation;
- restart: a generation in force but not running yet (launch, restore, the first step);
- waiting: no generation in force (waiting for nodes, a verdict on a suspect, a spare);
- checkpoint pauses: not measured. Checkpoint events carry no pause duration, so a blocking
  checkpoint's time stays inside "productive"; the report says so instead of printing 0.

Approximations, each stated in the README: step times are interpolated linearly between a
generation's first step, its newest committed snapshot and its last reported step; the first
step of each generation counts as restart time; wall times are the appending leader's clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ftsup.supervisor.core.events import (
    EndReason,
    GenerationEnded,
    GenerationRunning,
    GenerationStarted,
    JobCompleted,
    NodeDeclaredDead,
    Record,
    SnapshotCommitted,
)

CHECKPOINT_NOTE = "checkpoint pauses are not measured (checkpoint events carry no pause time); they count as productive"


@dataclass(frozen=True, slots=True)
class GoodputReport:
    """Seconds per bucket; the buckets sum to `wall_s` (checkpoint pauses are inside productive)."""

    since_unix_s: float | None  # where accounting starts; None: no generation seen yet
    until_unix_s: float  # now, or the job's completion
    wall_s: float
    productive_s: float
    detection_s: float
    restart_s: float
    lost_work_s: float
    waiting_s: float
    checkpoint_pause_s: float | None  # None: not measured
    unsaved_s: float  # productive time since the running generation's last committed snapshot
    generations: int
    interruptions: int  # generations that ended other than by the job completing
    interruptions_by_reason: tuple[tuple[str, int], ...]  # (EndReason value, count), most frequent first
    lost_steps: int
    first_seq: int  # the oldest record accounted (0: none)
    notes: tuple[str, ...]

    @property
    def ettr(self) -> float | None:
        """Effective training time ratio: productive time / wall time (None before anything ran)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else None


@dataclass(slots=True)
class _Segment:
    """A generation's productive span: steps (base_step, end_step], made from start_t to end_t."""

    generation: int
    base_step: int  # the step the generation restored (0: fresh)
    start_step: int  # its first step, completed at start_t
    start_t: float
    mark_step: int  # its newest committed snapshot (start_step when none)
    mark_t: float
    end_step: int
    end_t: float

    def time_of(self, step: int) -> float:
        """When `step` was done in this segment, interpolated; start_t if before it began."""
        if step <= self.start_step:
            return self.start_t
        if step <= self.mark_step:
            return _lerp(step, self.start_step, self.start_t, self.mark_step, self.mark_t)
        if self.end_step <= self.mark_step:
            return self.end_t  # no progress known past the mark: assume the step is the last one
        return min(self.end_t, _lerp(step, self.mark_step, self.mark_t, self.end_step, self.end_t))


def _lerp(x: int, x0: int, y0: float, x1: int, y1: float) -> float:
    return y1 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(slots=True)
class _Open:
    """The generation in force: when it started, and (once running) its open segment."""

    generation: int
    started_t: float
    restore_step: int
    segment: _Segment | None = None


@dataclass(slots=True)
class GoodputAccount:
    """The fold. Mutable and owned by one caller (like SoftState); `report` never mutates it."""

    since_t: float | None = None
    last_t: float = 0.0
    completed_t: float | None = None
    productive_s: float = 0.0  # closed segments, after truncation
    detection_s: float = 0.0
    restart_s: float = 0.0
    lost_work_s: float = 0.0
    waiting_s: float = 0.0
    lost_steps: int = 0
    generations: int = 0
    interruptions: Counter[str] = field(default_factory=Counter)
    first_seq: int = 0
    notes: list[str] = field(default_factory=list)
    current: _Open | None = None
    idle_since_t: float | None = None  # a generation ended and no other started yet
    segments: list[_Segment] = field(default_factory=list)  # closed, possibly truncated later
    dead_silence: dict[str, float] = field(default_factory=dict)  # node -> silent_for_s of its death

    def add(self, record: Record) -> None:
        t = record.time_unix_s
        if t < self.last_t:
            t = self.last_t  # a new leader's clock may lag: time never runs back
        self.last_t = t
        if self.first_seq == 0:
            self.first_seq = record.seq
            if record.seq > 1:
                self.notes.append(f"records before seq {record.seq} were compacted: accounting starts there")
        event = record.event
        if type(event) is SnapshotCommitted and self.since_t is not None:  # most of a long log: fast path
            segment = self.current.segment if self.current is not None else None
            if segment is not None and segment.generation == event.generation and event.step >= segment.mark_step:
                segment.mark_step, segment.mark_t = event.step, t
            return
        if self.completed_t is not None:
            return
        match event:
            case GenerationStarted():
                self._on_started(event, t)
            case GenerationRunning():
                self._adopt(event.generation, t, running_step=None)
                self._on_running(event, t)
            case SnapshotCommitted():
                self._adopt(event.generation, t, running_step=event.step)
                self._on_snapshot(event, t)
            case GenerationEnded():
                self._adopt(event.generation, t, running_step=event.last_step or None)
                self._on_ended(event, t)
            case NodeDeclaredDead():
                self.dead_silence[event.node_id] = event.silent_for_s
            case JobCompleted():
                self._close_idle(t)
                self.completed_t = t

    # -- folding -------------------------------------------------------------------------------
    def _adopt(self, generation: int, t: float, running_step: int | None) -> None:
        """A compacted log's window may open mid-generation: take it as in force from here."""
        if self.since_t is not None:
            return
        self.since_t = t
        self.generations = 1
        self.current = _Open(generation, t, 0)
        if running_step is not None:
            self.current.segment = _Segment(generation, running_step, running_step, t, running_step, t, running_step, t)
        self.notes.append(f"the log window opens inside generation {generation}")

    def _on_started(self, event: GenerationStarted, t: float) -> None:
        if self.since_t is None:
            self.since_t = t
        if self.current is not None:  # not in a valid log: close it as if it had ended here
            self._close(t, silent_s=0.0, last_step=0)
        self._close_idle(t)
        restore = event.restore_step or 0
        for segment in self.segments:
            self._truncate(segment, restore)
        self.segments = [s for s in self.segments if s.end_t > s.start_t or s.end_step > s.base_step]
        self.generations += 1
        self.current = _Open(event.generation, t, restore)

    def _on_running(self, event: GenerationRunning, t: float) -> None:
        current = self.current
        if current is None or current.generation != event.generation or current.segment is not None:
            return
        self.restart_s += max(0.0, t - current.started_t)
        step = event.first_step
        current.segment = _Segment(event.generation, current.restore_step, step, t, step, t, step, t)

    def _on_snapshot(self, event: SnapshotCommitted, t: float) -> None:
        current = self.current
        segment = current.segment if current is not None else None
        if segment is None or segment.generation != event.generation or event.step < segment.mark_step:
            return
        segment.mark_step, segment.mark_t = event.step, t

    def _on_ended(self, event: GenerationEnded, t: float) -> None:
        current = self.current
        if current is None or current.generation != event.generation:
            return
        silent = event.silent_for_s
        if not silent and event.reason is EndReason.NODE_LOST:
            silent = self.dead_silence.get(event.node_id, 0.0)  # logs written before the field existed
        if event.reason is not EndReason.COMPLETED:
            self.interruptions[event.reason.value] += 1
        self._close(t, silent_s=max(0.0, silent), last_step=event.last_step)
        self.idle_since_t = t

    def _close(self, t: float, *, silent_s: float, last_step: int) -> None:
        current = self.current
        assert current is not None
        self.current = None
        segment = current.segment
        begun = segment.start_t if segment is not None else current.started_t
        detection = min(silent_s, max(0.0, t - current.started_t))
        self.detection_s += detection
        failed_t = t - detection  # progress stopped here
        if segment is None:
            self.restart_s += max(0.0, failed_t - current.started_t)
            return
        if failed_t < begun:  # the failure came before the first step was reported
            self.restart_s -= begun - failed_t
            failed_t = begun
        segment.end_t = failed_t
        segment.end_step = max(last_step, segment.mark_step)
        segment.mark_t = min(segment.mark_t, failed_t)
        self.productive_s += failed_t - segment.start_t
        self.segments.append(segment)

    def _truncate(self, segment: _Segment, restore: int) -> None:
        """The next generation restores `restore`: this segment's later steps were wasted."""
        if segment.end_step <= restore:
            return
        cut_t = segment.time_of(restore) if restore >= segment.start_step else segment.start_t
        wasted = max(0.0, segment.end_t - cut_t)
        self.productive_s -= wasted
        self.lost_work_s += wasted
        self.lost_steps += segment.end_step - max(restore, segment.base_step)
        kept = max(segment.base_step, restore)
        segment.end_step, segment.end_t = kept, cut_t
        if segment.mark_step > kept:
            segment.mark_step, segment.mark_t = kept, cut_t
        if segment.start_step > kept:
            segment.start_step = kept

    def _close_idle(self, t: float) -> None:
        if self.idle_since_t is not None:
            self.waiting_s += max(0.0, t - self.idle_since_t)
            self.idle_since_t = None

    # -- reading -------------------------------------------------------------------------------
    def report(self, now_unix_s: float) -> GoodputReport:
        until = self.completed_t if self.completed_t is not None else max(now_unix_s, self.last_t)
        productive, restart, waiting, unsaved = self.productive_s, self.restart_s, self.waiting_s, 0.0
        current = self.current
        if current is not None and self.completed_t is None:
            segment = current.segment
            if segment is None:
                restart += max(0.0, until - current.started_t)
            else:
                productive += max(0.0, until - segment.start_t)
                unsaved = max(0.0, until - max(segment.start_t, segment.mark_t))
        if self.idle_since_t is not None and self.completed_t is None:
            waiting += max(0.0, until - self.idle_since_t)
        wall = max(0.0, until - self.since_t) if self.since_t is not None else 0.0
        return GoodputReport(
            since_unix_s=self.since_t,
            until_unix_s=until,
            wall_s=wall,
            productive_s=productive,
            detection_s=self.detection_s,
            restart_s=restart,
            lost_work_s=self.lost_work_s,
            waiting_s=waiting,
            checkpoint_pause_s=None,
            unsaved_s=unsaved,
            generations=self.generations,
            interruptions=sum(self.interruptions.values()),
            interruptions_by_reason=tuple(sorted(self.interruptions.items(), key=lambda kv: (-kv[1], kv[0]))),
            lost_steps=self.lost_steps,
            first_seq=self.first_seq,
            notes=(*self.notes, CHECKPOINT_NOTE),
        )


def goodput(records: list[Record], now_unix_s: float) -> GoodputReport:
    """The report for a whole log at once (tests, offline analysis of an exported log)."""
    account = GoodputAccount()
    for record in records:
        account.add(record)
    return account.report(now_unix_s)
