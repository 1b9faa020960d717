"""What the Operator service remembers from reading the event log: goodput, recent straggler
detections and when the newest snapshot and checkpoint committed.

Why here and not per call: `supervisorctl goodput` (and `status`'s ETTR line) would otherwise
reread the whole log on every call. The digest reads each record once, in batches that yield to
the event loop between them, so a first call on a long log never stalls agents' heartbeats.
It reads the log (not the runtime's state), so followers answer too.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator

from ftsup.supervisor.core.events import CheckpointCommitted, Record, SnapshotCommitted, StragglerDetected
from ftsup.supervisor.core.goodput import GoodputAccount, GoodputReport
from ftsup.supervisor.eventlog.api import EventLog

BATCH = 2000  # records read between yields to the event loop
KEEP_DETECTIONS = 50


class LogDigest:
    def __init__(self) -> None:
        self.account = GoodputAccount()
        self.next_seq = 1
        self.detections: deque[Record] = deque(maxlen=KEEP_DETECTIONS)
        self.snapshot_unix_s: tuple[int, float] | None = None  # (step, commit time)
        self.checkpoint_unix_s: tuple[str, float] | None = None  # (checkpoint id, commit time)
        self._lock = asyncio.Lock()

    async def catch_up(self, log: EventLog) -> None:
        """Folds every record appended since the last call, yielding to the loop every BATCH.

        One reader is kept across the yields (reopening one per batch would rescan a segment
        each time); if the log changed under it (a snapshot moved records from memory to disk),
        the seq check sees the gap and the reader is reopened where the fold stopped.
        """
        async with self._lock:
            reader: Iterator[Record] | None = None
            is_reopened = False
            folded = 0
            while True:
                if reader is None:
                    since = max(self.next_seq, log.first_seq)  # older records may have been compacted
                    if since > self.next_seq > 1:
                        self.account.notes.append(f"records {self.next_seq}..{since - 1} were compacted before they were read")
                    self.next_seq = since
                    reader = iter(log.read(since))
                record = next(reader, None)
                if record is None:
                    return
                if record.seq != self.next_seq:
                    if not is_reopened:
                        reader, is_reopened = None, True
                        continue
                    self.account.notes.append(f"records {self.next_seq}..{record.seq - 1} could not be read")
                    self.next_seq = record.seq
                is_reopened = False
                self._add(record)
                self.next_seq = record.seq + 1
                folded += 1
                if folded % BATCH == 0:
                    await asyncio.sleep(0)

    def _add(self, record: Record) -> None:
        self.account.add(record)
        event = record.event
        if isinstance(event, SnapshotCommitted):
            self.snapshot_unix_s = (event.step, record.time_unix_s)
        elif isinstance(event, StragglerDetected):
            self.detections.append(record)
        elif isinstance(event, CheckpointCommitted):
            self.checkpoint_unix_s = (event.checkpoint_id, record.time_unix_s)

    def goodput(self, now_unix_s: float) -> GoodputReport:
        return self.account.report(now_unix_s)
