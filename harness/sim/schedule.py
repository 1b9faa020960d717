"""Where wall time goes while a job trains: work, snapshot pauses, checkpoint pauses.

Training runs in cycles: `cycle_work_s` of steps, then a pause of `snapshot_pause_s` after which
the cycle's snapshot is committed; after every `cycles_per_checkpoint`-th cycle a checkpoint pause
of `checkpoint_pause_s` commits a checkpoint. The job ends the moment its work is done (no pause
after the last cycle). Progress is in seconds of useful work; cycle and checkpoint boundaries lie
at whole multiples of the cycle from the job's start, so a restore always lands on a boundary.
`walk` answers in closed form per checkpoint interval, so a month of 10 s steps costs a few loops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Schedule:
    work_s: float  # the job's useful work
    cycle_work_s: float
    snapshot_pause_s: float
    cycles_per_checkpoint: int
    checkpoint_pause_s: float

    @property
    def cycles(self) -> int:
        return max(1, math.ceil(self.work_s / self.cycle_work_s - 1e-9))

    def cycle_of(self, progress_s: float) -> int:
        """The cycle index of a boundary (restore points are boundaries; rounding absorbs float noise)."""
        return round(progress_s / self.cycle_work_s)

    def is_checkpoint_boundary(self, progress_s: float) -> bool:
        k = self.cycle_of(progress_s)
        return 0 < k < self.cycles and k % self.cycles_per_checkpoint == 0


@dataclass(frozen=True, slots=True)
class Walk:
    """What `elapsed_s` of wall time from a (re)start achieved, or when the job finished."""

    reached_s: float  # progress reached, in-flight work included
    snapshot_s: float  # progress of the newest committed snapshot
    checkpoint_s: float  # progress of the newest committed checkpoint
    snapshot_pause_s: float  # time spent in snapshot pauses (a pause cut short counts)
    checkpoint_pause_s: float
    is_finished: bool
    used_s: float  # elapsed_s, or less when the job finished


def walk(schedule: Schedule, start_s: float, checkpoint_s: float, is_checkpoint_due: bool, elapsed_s: float) -> Walk:
    """Trains from boundary `start_s` for `elapsed_s` (or until done).

    `is_checkpoint_due`: the start is a checkpoint boundary whose checkpoint did not commit, so
    its pause comes first (a restore from a RAM snapshot taken just before the checkpoint).
    """
    cw, sp, cp = schedule.cycle_work_s, schedule.snapshot_pause_s, schedule.checkpoint_pause_s
    m, last = schedule.cycles_per_checkpoint, schedule.cycles - 1
    e, k = elapsed_s, schedule.cycle_of(start_s)
    progress, snap, snap_pause, ckpt_pause = start_s, start_s, 0.0, 0.0

    def stop(reached: float) -> Walk:
        return Walk(reached, snap, checkpoint_s, snap_pause, ckpt_pause, False, elapsed_s)

    if k > last:
        return Walk(progress, snap, checkpoint_s, 0.0, 0.0, True, 0.0)
    if is_checkpoint_due:
        if e < cp:
            ckpt_pause += e
            return stop(progress)
        e -= cp
        ckpt_pause += cp
        checkpoint_s = progress
    full = cw + sp
    while True:
        # Cycles k.. before the next special one (followed by a checkpoint, or the job's last)
        # are identical: work then a snapshot pause.
        special = min(k + m - (k % m) - 1, last)
        uniform = special - k
        if uniform > 0:
            done = uniform if math.isinf(e) else min(uniform, int(e // full))
            k += done
            e -= done * full
            snap_pause += done * sp
            progress = snap = k * cw
            if done < uniform:
                if e < cw:
                    return stop(progress + e)
                snap_pause += e - cw
                return stop(progress + cw)
        if k == last:
            work = schedule.work_s - progress
            if e < work:
                return stop(progress + e)
            used = schedule.work_s - start_s + snap_pause + ckpt_pause  # (elapsed_s may be infinite)
            return Walk(schedule.work_s, snap, checkpoint_s, snap_pause, ckpt_pause, True, used)
        if e < cw:
            return stop(progress + e)
        e -= cw
        k += 1
        progress = k * cw
        if e < sp:
            snap_pause += e
            return stop(progress)
        e -= sp
        snap_pause += sp
        snap = progress
        if e < cp:
            ckpt_pause += e
            return stop(progress)
        e -= cp
        ckpt_pause += cp
        checkpoint_s = progress
