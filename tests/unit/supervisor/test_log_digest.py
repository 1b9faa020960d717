"""The operator service's log digest: each record folded once, in order, across calls and gaps."""

from __future__ import annotations

from ftsup.supervisor.core.events import GenerationRunning, GenerationStarted, SnapshotCommitted, StragglerDetected
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.server import log_digest
from ftsup.supervisor.server.log_digest import LogDigest


def started(generation: int) -> GenerationStarted:
    return GenerationStarted(generation, (), 1, "h", 1, None, 0, (), "test")


async def test_the_digest_folds_only_new_records_on_each_call_and_keeps_recent_detections(monkeypatch):
    monkeypatch.setattr(log_digest, "BATCH", 3)  # several yields to the loop per call
    log = MemoryLog()
    await log.append([started(1), GenerationRunning(1, 1)], term=0, time_unix_s=10.0, expect_seq=0)
    digest = LogDigest()
    await digest.catch_up(log)
    assert digest.next_seq == 3 and digest.goodput(20.0).productive_s == 10.0
    commits = [SnapshotCommitted(1, s) for s in range(2, 9)]
    await log.append([*commits, StragglerDetected("n1", 0, 4.2, 8, 6, "slow")], term=0, time_unix_s=15.0,
                     expect_seq=2)
    await digest.catch_up(log)
    await digest.catch_up(log)  # nothing new: nothing folded twice
    assert digest.next_seq == 11 and digest.snapshot_unix_s == (8, 15.0)
    assert [r.seq for r in digest.detections] == [10]
    report = digest.goodput(20.0)
    assert report.unsaved_s == 5.0 and report.productive_s == 10.0 and report.first_seq == 1
