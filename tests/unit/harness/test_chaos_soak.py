"""The soak's bounds on hand-built inputs: each violated bound is named, a clean run names none."""

from __future__ import annotations

from ftsup.harness.chaos import soak
from ftsup.harness.chaos.soak import Limits, Usage, growth_problems, log_bound_problems, restarts_without_progress
from ftsup.v1 import events_pb2

LIMITS = Limits(rss_growth_mib=10, fd_growth=2, thread_growth=1, task_growth=3)
BASE = Usage(rss_kib=50_000, fds=20, threads=10, tasks=30)


def test_growth_within_limits_is_no_problem() -> None:
    end = Usage(rss_kib=50_000 + 10 * 1024, fds=22, threads=11, tasks=33)
    assert growth_problems("node-1", BASE, end, LIMITS) == []


def test_every_bound_broken_is_named() -> None:
    end = Usage(rss_kib=50_000 + 11 * 1024, fds=23, threads=12, tasks=34)
    problems = growth_problems("supervisor", BASE, end, LIMITS)
    assert [p.split(":")[1].split()[0] for p in problems] == ["RSS", "open", "threads", "asyncio"]
    assert all(p.startswith("supervisor: ") for p in problems)


def test_unknown_task_counts_are_not_judged() -> None:
    assert growth_problems("node-2", BASE, Usage(50_000, 20, 10, None), LIMITS) == []


def record(seq: int, **event: object) -> events_pb2.Record:
    return events_pb2.Record(seq=seq, event=events_pb2.Event(**event))


def test_a_generation_that_ended_without_progress_is_named() -> None:
    records = [
        record(1, generation_started=events_pb2.GenerationStarted(generation=1)),
        record(2, generation_ended=events_pb2.GenerationEnded(generation=1, last_step=5,
                                                              reason=events_pb2.END_REASON_HUNG)),
        record(3, generation_started=events_pb2.GenerationStarted(generation=2, restore_step=5)),
        record(4, generation_ended=events_pb2.GenerationEnded(generation=2, last_step=5,
                                                              reason=events_pb2.END_REASON_HUNG)),
        record(5, generation_started=events_pb2.GenerationStarted(generation=3, restore_step=5)),
        record(6, generation_ended=events_pb2.GenerationEnded(generation=3, last_step=9,
                                                              reason=events_pb2.END_REASON_COMPLETED)),
    ]
    problems = restarts_without_progress(records)
    assert len(problems) == 1 and problems[0].startswith("generation 2 ended (END_REASON_HUNG) at step 5"), problems


def test_a_log_compacted_to_its_bound_is_no_problem_even_in_one_segment() -> None:
    assert log_bound_problems(559, {1: 41_048}, [400, 500], 100) == []
    assert log_bound_problems(50, {1: 4_000}, [], 100) == []  # no snapshot due yet
    assert log_bound_problems(1_000, {450: 900, 850: 500}, [800, 900], 100) == []  # 450's holds 800


def test_a_log_that_stopped_compacting_is_named() -> None:
    (behind,) = log_bound_problems(900, {1: 41_048}, [400, 500], 100)
    assert "newest snapshot (seq 500) is 400 records behind" in behind
    (covered,) = log_bound_problems(1_000, {1: 900, 450: 500, 950: 10}, [800, 900], 100)
    assert "keeps 1 segment(s) its older snapshot (seq 800) covers, from seq 1" in covered
    (many,) = log_bound_problems(1_000, {1: 10}, [800, 900, 950], 100)
    assert "3 snapshots" in many


def test_an_etcd_log_within_two_snapshot_intervals_is_no_problem() -> None:
    assert soak.etcd_bound_problems(head_seq=1000, records=180, blobs=3, snapshot_every=100) == []
    assert soak.etcd_bound_problems(head_seq=150, records=150, blobs=0, snapshot_every=100) == []


def test_an_etcd_log_that_stopped_compacting_or_leaked_blobs_is_named() -> None:
    problems = soak.etcd_bound_problems(head_seq=1000, records=900, blobs=950, snapshot_every=100)
    assert any("900 log records > 2 x --snapshot-every 100" in p for p in problems)
    assert any("950 out-of-line blobs for 900 records" in p for p in problems)


def test_etcd_is_a_soak_flag_only_and_adds_leader_kills_to_the_rotation(capsys) -> None:
    from ftsup.harness.chaos.main import main

    assert main(["leader_kill", "--etcd"]) == 2
    assert "--etcd applies to `soak`" in capsys.readouterr().err
    assert soak.ETCD_KINDS[-1] == "leader_kill" and set(soak.KINDS) < set(soak.ETCD_KINDS)
    assert "leader_kill" not in soak.RESTARTS


def test_records_compacted_before_the_soak_read_them_are_no_hole_but_a_hole_still_is() -> None:
    from ftsup.harness.chaos import checks

    read = [events_pb2.Record(seq=s) for s in (1, 2, 5, 6)]
    assert checks.gap_problems(soak.compaction_filled(read, {3, 4})) == []
    assert "missing seqs [4]" in checks.gap_problems(soak.compaction_filled(read, {3}))[0]


def test_the_log_follower_counts_what_compaction_took_before_a_stream_reached_it_but_names_a_hole_in_one() -> None:
    from ftsup.harness.chaos.log_follower import LogFollower

    follower = LogFollower(lambda: "unused:0")
    follower._take(iter(events_pb2.Record(seq=s) for s in (4, 5, 6)), since=1)  # 1-3 compacted first
    assert follower.compacted_unread == {1, 2, 3} and follower.read_problems == []
    follower._take(iter(events_pb2.Record(seq=s) for s in (7, 9)), since=7)  # 8 missing mid-stream
    assert follower.read_problems == ["the event log followed from seq 7 went from 7 to 9"]
    assert [r.seq for r in follower.records()] == [4, 5, 6, 7, 9] and follower.head() == 9
