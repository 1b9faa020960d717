"""Goodput accounting over hand-made logs whose answers are worked out in the comments."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core.events import (
    EndReason,
    Event,
    GenerationEnded,
    GenerationRunning,
    GenerationStarted,
    JobCompleted,
    NodeDeclaredDead,
    Record,
    SnapshotCommitted,
)
from ftsup.supervisor.core.goodput import GoodputAccount, GoodputReport, goodput


def started(generation: int, restore_step: int | None = None) -> GenerationStarted:
    return GenerationStarted(generation, (), 2, "127.0.0.1", 29500, restore_step, 0, (), "test")


def ended(generation: int, reason: EndReason, last_step: int, silent_for_s: float = 0.0, node: str = "n2") -> GenerationEnded:
    return GenerationEnded(generation, reason, node, last_step, "test", silent_for_s)


def log(*timed: tuple[float, Event], first_seq: int = 1) -> list[Record]:
    return [Record(first_seq + i, 1, t, event) for i, (t, event) in enumerate(timed)]


def buckets(report: GoodputReport) -> float:
    return report.productive_s + report.detection_s + report.restart_s + report.lost_work_s + report.waiting_s


def test_a_clean_run_is_productive_but_for_its_start():
    records = log(
        (0.0, started(1)),
        (10.0, GenerationRunning(1, 1)),
        (60.0, SnapshotCommitted(1, 50)),
        (110.0, ended(1, EndReason.COMPLETED, 100, node="")),
        (110.0, JobCompleted(1, 100, "d")),
    )
    report = goodput(records, now_unix_s=500.0)  # after completion the clock stops at 110
    assert report.wall_s == 110.0 and report.until_unix_s == 110.0
    assert report.restart_s == 10.0 and report.productive_s == 100.0
    assert report.ettr == pytest.approx(100 / 110)
    assert report.interruptions == 0 and report.lost_steps == 0 and report.lost_work_s == 0.0


def test_a_lost_node_costs_its_detection_its_unsaved_steps_and_the_restart():
    # Generation 1 runs from t=10 (step 1), commits step 50 at t=60 and reaches step 70; the node
    # goes silent at t=80 and is declared dead at t=85 (silent 5 s). Generation 2 restores step 50:
    # steps 51..70 (t=60..80, 20 s) were wasted. It runs from t=100 until now (t=200).
    records = log(
        (0.0, started(1)),
        (10.0, GenerationRunning(1, 1)),
        (60.0, SnapshotCommitted(1, 50)),
        (85.0, NodeDeclaredDead("n2", "heartbeat overdue", 5.0)),
        (85.0, ended(1, EndReason.NODE_LOST, 70, silent_for_s=5.0)),
        (85.0, started(2, restore_step=50)),
        (100.0, GenerationRunning(2, 51)),
    )
    report = goodput(records, now_unix_s=200.0)
    assert report.wall_s == 200.0
    assert report.detection_s == 5.0
    assert report.lost_work_s == 20.0 and report.lost_steps == 20
    assert report.restart_s == 10.0 + 15.0
    assert report.productive_s == 50.0 + 100.0
    assert report.waiting_s == 0.0
    assert report.unsaved_s == 100.0  # generation 2 has committed nothing yet
    assert report.ettr == 0.75
    assert report.interruptions_by_reason == (("node_lost", 1),)


def test_time_without_a_generation_is_waiting_and_old_logs_take_detection_from_the_death():
    # No silent_for_s on the GenerationEnded (a log written before the field): the death's is used.
    records = log(
        (0.0, started(1)),
        (10.0, GenerationRunning(1, 1)),
        (20.0, SnapshotCommitted(1, 11)),
        (24.0, NodeDeclaredDead("n2", "stream closed", 4.0)),
        (24.0, ended(1, EndReason.NODE_LOST, 11)),
        (54.0, started(2, restore_step=11)),  # 30 s waiting for a healthy node
    )
    report = goodput(records, now_unix_s=60.0)
    assert report.detection_s == 4.0 and report.waiting_s == 30.0 and report.restart_s == 10.0 + 6.0
    assert report.lost_work_s == 0.0 and report.productive_s == 10.0  # t=10..20 survived
    assert buckets(report) == report.wall_s == 60.0


def test_a_fresh_restart_throws_away_every_earlier_generation():
    # Gen 1: step 1 at t=10, commits 50 at t=60, Xid at t=80 (step 70): 20 s / 20 steps lost.
    # Gen 2 restores 50, runs 51..80 from t=90, node lost at t=120 after 10 s of silence: ran t=90..110.
    # Gen 3 starts fresh at t=130 (the snapshot holders are gone): gen 2's 20 s (30 steps) and gen 1's
    # surviving t=10..60 (50 steps) are lost too. 70 + 30 = 100 steps were done for nothing.
    records = log(
        (0.0, started(1)),
        (10.0, GenerationRunning(1, 1)),
        (60.0, SnapshotCommitted(1, 50)),
        (80.0, ended(1, EndReason.XID, 70)),
        (80.0, started(2, restore_step=50)),
        (90.0, GenerationRunning(2, 51)),
        (120.0, ended(2, EndReason.NODE_LOST, 80, silent_for_s=10.0)),
        (130.0, started(3)),
    )
    report = goodput(records, now_unix_s=130.0)
    assert report.lost_steps == 100
    assert report.lost_work_s == 20.0 + 20.0 + 50.0
    assert report.productive_s == 0.0
    assert report.detection_s == 10.0 and report.waiting_s == 10.0 and report.restart_s == 10.0 + 10.0 + 0.0
    assert buckets(report) == report.wall_s == 130.0
    assert report.generations == 3 and report.interruptions == 2


def test_lost_time_is_interpolated_between_the_commit_and_the_last_step():
    # Step 1 at t=0 (running), commit 11 at t=10, last step 31 at t=30; the restore is step 21,
    # which lies halfway between the commit and the end: t=20, so 10 s (10 steps) are lost.
    records = log(
        (0.0, started(1)),
        (0.0, GenerationRunning(1, 1)),
        (10.0, SnapshotCommitted(1, 11)),
        (30.0, ended(1, EndReason.TRAINER_EXITED, 31)),
        (30.0, started(2, restore_step=21)),
    )
    report = goodput(records, now_unix_s=30.0)
    assert report.lost_work_s == 10.0 and report.lost_steps == 10 and report.productive_s == 20.0


def test_a_generation_that_fails_before_its_first_step_is_all_restart_and_detection():
    records = log(
        (0.0, started(1)),
        (8.0, ended(1, EndReason.NODE_LOST, 0, silent_for_s=3.0)),
        (8.0, started(2)),
    )
    report = goodput(records, now_unix_s=10.0)
    assert report.restart_s == 5.0 + 2.0 and report.detection_s == 3.0 and report.productive_s == 0.0


def test_detection_longer_than_the_running_span_eats_into_the_start_not_below_zero():
    records = log(
        (0.0, started(1)),
        (10.0, GenerationRunning(1, 1)),
        (12.0, ended(1, EndReason.HUNG, 1, silent_for_s=5.0)),
    )
    report = goodput(records, now_unix_s=12.0)
    assert report.detection_s == 5.0 and report.restart_s == 7.0 and report.productive_s == 0.0
    assert buckets(report) == report.wall_s == 12.0


def test_a_compacted_window_that_opens_mid_generation_is_accounted_from_there_and_says_so():
    records = log(
        (100.0, SnapshotCommitted(4, 500)),
        (150.0, SnapshotCommitted(4, 550)),
        first_seq=9001,
    )
    report = goodput(records, now_unix_s=160.0)
    assert report.first_seq == 9001 and report.wall_s == 60.0 and report.productive_s == 60.0
    assert report.unsaved_s == 10.0
    assert any("compacted" in n for n in report.notes) and any("inside generation 4" in n for n in report.notes)


def test_checkpoint_pauses_are_reported_as_not_measured_rather_than_zero():
    report = goodput(log((0.0, started(1))), now_unix_s=5.0)
    assert report.checkpoint_pause_s is None and any("not measured" in n for n in report.notes)
    assert report.restart_s == 5.0 and report.ettr == 0.0


def test_nothing_run_yet_has_no_ratio():
    report = goodput([], now_unix_s=5.0)
    assert report.ettr is None and report.wall_s == 0.0 and report.since_unix_s is None


def test_reporting_does_not_change_the_account_and_a_lagging_clock_never_runs_time_back():
    account = GoodputAccount()
    for record in log((0.0, started(1)), (10.0, GenerationRunning(1, 1)), (5.0, SnapshotCommitted(1, 3))):
        account.add(record)  # the last record's clock lags (a new leader): taken as t=10
    first = account.report(20.0)
    assert account.report(20.0) == first
    assert first.productive_s == 10.0 and first.unsaved_s == 10.0 and buckets(first) == first.wall_s


lifecycle = st.tuples(
    st.floats(0, 50), st.one_of(st.none(), st.floats(0, 50)),  # gap before start, start -> running
    st.floats(0, 100), st.integers(0, 40),  # running span, steps made
    st.one_of(st.none(), st.floats(0, 1)),  # where in the run a snapshot committed (fraction)
    st.floats(0, 30), st.sampled_from([EndReason.NODE_LOST, EndReason.HUNG, EndReason.XID]),
    st.booleans(),  # restore from the committed snapshot, or fresh
)


@settings(max_examples=100, deadline=None)
@given(st.lists(lifecycle, min_size=1, max_size=6), st.floats(0, 100))
def test_buckets_always_sum_to_the_wall_time_and_none_is_negative(lives, tail):
    records: list[tuple[float, Event]] = []
    t, step, committed = 0.0, 0, None
    for number, (gap, to_running, run, steps, commit_at, silent, reason, use_snapshot) in enumerate(lives, 1):
        t += gap
        restore = committed if use_snapshot else None
        records.append((t, started(number, restore)))
        step = restore or 0
        if to_running is not None:
            t += to_running
            records.append((t, GenerationRunning(number, step + 1)))
            if commit_at is not None and steps:
                records.append((t + run * commit_at, SnapshotCommitted(number, step + 1 + int(steps * commit_at))))
                committed = step + 1 + int(steps * commit_at)
            t += run
            step += 1 + steps
        records.append((t, ended(number, reason, step, silent_for_s=silent)))
    records.sort(key=lambda r: r[0])  # snapshot commits inside the run
    report = goodput(log(*records), now_unix_s=t + tail)
    for value in (report.productive_s, report.detection_s, report.restart_s, report.lost_work_s, report.waiting_s):
        assert value >= -1e-9
    assert buckets(report) == pytest.approx(report.wall_s, abs=1e-6)
    assert report.lost_steps >= 0
