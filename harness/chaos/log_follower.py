"""The soak's copy of the event log, kept by following it (ListEvents with `follow`) in a thread.

Polling the log between waits lost records on etcd: its log compacts what a snapshot covers as
soon as the snapshot is stored, and a third 50-failure run saw a GenerationEnded and the next
GenerationStarted appended and compacted 32 ms apart, between two 0.1 s polls, so the failure
that caused them could never be attributed (attribution.py needs both). A follow stream hands
each record over as it is appended. When the stream breaks (its replica killed, a leader
change) the follower reconnects, from the seq after the last it holds, to whichever replica
`address()` names then; records compacted in between are counted as `compacted_unread` (the
log's contract allows that), while a hole inside one stream is a problem (`read_problems`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import grpc

from ftsup.v1 import events_pb2, operator_pb2, operator_pb2_grpc

RECONNECT_S = 0.1  # between attempts while no replica answers


class LogFollower:
    """Every record seen since `start()`, by seq; thread-safe reads."""

    def __init__(self, address: Callable[[], str]) -> None:
        self._address = address
        self._lock = threading.Lock()
        self._records: dict[int, events_pb2.Record] = {}
        self.compacted_unread: set[int] = set()
        self.read_problems: list[str] = []
        self._stopping = threading.Event()
        self._call: grpc.RpcContext | None = None  # the stream now open, cancelled by stop()
        self._thread = threading.Thread(target=self._run, name="soak-log-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=10)

    def records(self) -> list[events_pb2.Record]:
        with self._lock:
            return [self._records[s] for s in sorted(self._records)]

    def head(self) -> int:
        with self._lock:
            return max(self._records, default=0)

    def _run(self) -> None:
        while not self._stopping.is_set():
            since = self.head() + 1
            try:
                with grpc.insecure_channel(self._address()) as channel:
                    call = operator_pb2_grpc.OperatorStub(channel).ListEvents(
                        operator_pb2.ListEventsRequest(since_seq=since, follow=True))
                    with self._lock:
                        self._call = call
                    if self._stopping.is_set():
                        call.cancel()
                    self._take(call, since)
            except grpc.RpcError:
                pass
            finally:
                with self._lock:
                    self._call = None
            self._stopping.wait(RECONNECT_S)

    def _take(self, stream: Iterable[events_pb2.Record], since: int) -> None:
        expected = since
        for record in stream:
            with self._lock:
                if expected == since and record.seq > since:  # compacted before this stream reached it
                    self.compacted_unread.update(range(since, record.seq))
                elif record.seq != expected:
                    self.read_problems.append(f"the event log followed from seq {since} went from"
                                              f" {expected - 1} to {record.seq}")
                self._records[record.seq] = record
            expected = record.seq + 1
