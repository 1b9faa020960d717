"""Training-time arithmetic of the simulator: pauses, commits, and what a failure finds."""

from __future__ import annotations

import math

import pytest

from ftsup.harness.sim.schedule import Schedule, walk

# 100 s of work in 10 s cycles, a 1 s snapshot pause after each, a 5 s checkpoint every 3 cycles.
S = Schedule(work_s=100.0, cycle_work_s=10.0, snapshot_pause_s=1.0, cycles_per_checkpoint=3, checkpoint_pause_s=5.0)


def test_an_uninterrupted_job_takes_its_work_plus_every_pause_but_none_after_the_last_cycle():
    done = walk(S, 0.0, 0.0, False, math.inf)
    assert done.is_finished
    assert done.used_s == 100.0 + 9 * 1.0 + 3 * 5.0  # checkpoints at 30, 60, 90
    assert (done.snapshot_pause_s, done.checkpoint_pause_s, done.checkpoint_s) == (9.0, 15.0, 90.0)


@pytest.mark.parametrize(
    ("elapsed", "reached", "snapshot", "checkpoint", "snap_pause", "ckpt_pause"),
    [
        (5.0, 5.0, 0.0, 0.0, 0.0, 0.0),  # mid-step: nothing committed
        (10.5, 10.0, 0.0, 0.0, 0.5, 0.0),  # mid-snapshot pause: that snapshot is not committed
        (11.0, 10.0, 10.0, 0.0, 1.0, 0.0),  # the pause ended: committed
        (35.0, 30.0, 30.0, 0.0, 3.0, 2.0),  # mid-checkpoint: the snapshot holds, the checkpoint not
        (38.0, 30.0, 30.0, 30.0, 3.0, 5.0),
        (39.0, 31.0, 30.0, 30.0, 3.0, 5.0),
    ],
)
def test_a_failure_finds_the_newest_committed_snapshot_and_checkpoint(elapsed, reached, snapshot, checkpoint,
                                                                      snap_pause, ckpt_pause):
    done = walk(S, 0.0, 0.0, False, elapsed)
    assert not done.is_finished
    assert (done.reached_s, done.snapshot_s, done.checkpoint_s) == (reached, snapshot, checkpoint)
    assert (done.snapshot_pause_s, done.checkpoint_pause_s) == (snap_pause, ckpt_pause)


def test_a_restart_at_an_uncommitted_checkpoint_boundary_takes_the_checkpoint_first():
    assert walk(S, 30.0, 0.0, True, 3.0).checkpoint_s == 0.0
    again = walk(S, 30.0, 0.0, True, 6.0)
    assert (again.checkpoint_s, again.checkpoint_pause_s, again.reached_s) == (30.0, 5.0, 31.0)
    assert S.is_checkpoint_boundary(30.0) and not S.is_checkpoint_boundary(40.0)
    assert not S.is_checkpoint_boundary(0.0)


def test_a_restart_mid_job_finishes_in_the_remaining_work_and_pauses():
    done = walk(S, 60.0, 60.0, False, math.inf)
    assert done.is_finished
    assert done.used_s == 40.0 + 3 * 1.0 + 5.0  # snapshots after 70, 80, 90; a checkpoint at 90


def test_a_month_of_ten_second_steps_walks_in_closed_form():
    month = Schedule(30 * 86400.0, 10.0, 0.2, 2160, 60.0)
    done = walk(month, 0.0, 0.0, False, math.inf)
    cycles = 259_200
    assert done.used_s == pytest.approx(30 * 86400.0 + (cycles - 1) * 0.2 + (cycles // 2160 - 1) * 60.0)
