"""Power loss under the embedded log: hundreds of seeded crash points over a simulated disk that
drops, zeroes or tears whatever was not fsynced (tests/support/powerloss_fs.py).

A SIGKILL test keeps the page cache and so cannot see a missing fsync or a zero-filled tail; this
one can. The properties: every acknowledged record (its append returned, so its fsync did) is
still there after the crash, a record that is there is one that was written, and opening never
refuses a log that lost only unacknowledged bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import random

import pytest

from ftsup.supervisor.core.events import NodeCleared
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.api import LogError
from ftsup.supervisor.eventlog.embedded import EmbeddedLog
from tests.support.powerloss_fs import PowerLossFs

ROOT = pathlib.Path("/sim")
DATA = ROOT / "data"  # below the root, so the data directory's own entry can be lost too
SEGMENT_BYTES = 4096
CRASH_POINTS = 300


def _event(seq: int) -> NodeCleared:
    return NodeCleared(f"node-{seq}", "x" * (seq % 97))


@dataclasses.dataclass
class _Run:
    acked: dict[int, NodeCleared] = dataclasses.field(default_factory=dict)  # seq -> event, fsync returned
    attempted: dict[int, NodeCleared] = dataclasses.field(default_factory=dict)


async def _workload(fs: PowerLossFs, rng: random.Random, run: _Run) -> None:
    """Opens, appends batches across segment rolls, snapshots and compacts, until done or the crash."""
    log = EmbeddedLog(DATA, segment_bytes=SEGMENT_BYTES, ops=fs)
    for _ in range(30):
        head = log.head_seq
        events = [_event(head + 1 + i) for i in range(rng.randint(1, 6))]
        for i, event in enumerate(events):
            run.attempted[head + 1 + i] = event
        records = await log.append(events, term=1, time_unix_s=0.0)
        run.acked.update((r.seq, r.event) for r in records)
        if rng.random() < 0.15:
            await log.save_snapshot(dataclasses.replace(ClusterState(), applied_seq=log.head_seq))
            await log.compact()
    log.close()


def _check_reopens(fs: PowerLossFs, run: _Run) -> EmbeddedLog:
    log = EmbeddedLog(DATA, segment_bytes=SEGMENT_BYTES, ops=fs)  # must not refuse
    snapshot = log.load_snapshot()
    covered = snapshot.applied_seq if snapshot is not None else 0
    held = {r.seq: r.event for r in log.read(log.first_seq)}
    assert log.first_seq <= covered + 1, "records were compacted that no snapshot covers"
    lost = [seq for seq in run.acked if seq > covered and held.get(seq) != run.acked[seq]]
    assert not lost, f"acknowledged records lost or changed: {lost[:5]}"
    forged = [seq for seq, event in held.items() if run.attempted.get(seq) != event]
    assert not forged, f"records that were never written: {forged[:5]}"
    return log


def _one_crash(seed: int) -> int:
    rng = random.Random(seed)
    fs = PowerLossFs(ROOT, rng, crash_at=rng.randint(1, 100))
    run = _Run()
    try:
        asyncio.run(_workload(fs, rng, run))
    except (OSError, LogError):
        assert fs.crashed, "only the simulated crash may fail the workload"
    crashed_at = fs.ops if fs.crashed else 0
    fs.crash()
    log = _check_reopens(fs, run)
    # The log goes on from where it stands, and a clean reopen finds it whole.
    nxt = log.head_seq + 1
    run.attempted[nxt] = _event(nxt)
    records = asyncio.run(log.append([_event(nxt)], term=2, time_unix_s=0.0))
    run.acked[nxt] = records[0].event
    log.close()
    again = _check_reopens(fs, run)
    assert again.head_seq == nxt and again.truncated_bytes == 0
    again.close()
    return crashed_at


def test_power_loss_at_hundreds_of_points_keeps_every_acknowledged_record_and_reopens():
    crashed = [_one_crash(seed) for seed in range(CRASH_POINTS)]
    assert sum(1 for c in crashed if c) > CRASH_POINTS * 0.8, "most runs must crash before finishing"


@pytest.mark.parametrize("seed", [3])
def test_a_zero_filled_tail_after_power_loss_is_truncated_not_refused(seed: int):
    rng = random.Random(seed)
    fs = PowerLossFs(ROOT, rng)
    log = EmbeddedLog(DATA, segment_bytes=SEGMENT_BYTES, ops=fs)
    asyncio.run(log.append([_event(1), _event(2)], term=1, time_unix_s=0.0))
    segment = log.segments[-1].path
    log.close()
    fs.open_append(segment).write(bytes(4096))  # the size grew, the data never landed
    reopened = EmbeddedLog(DATA, segment_bytes=SEGMENT_BYTES, ops=fs)
    assert reopened.truncated_bytes == 4096 and reopened.head_seq == 2
