"""The demo's failure figures come from the log; a record whose event this build cannot name
(written by a newer supervisor) is passed over, not a crash of the whole run's report."""

from __future__ import annotations

from ftsup.harness.demo import Failure, measure_failure
from ftsup.v1 import events_pb2

KILLED_AT = 1_000.0


def test_a_record_of_an_unknown_kind_is_skipped_and_detection_still_measured() -> None:
    failure = Failure(kind="node_kill", node="n1", at_step=5, killed_at=KILLED_AT)
    unknown = events_pb2.Record(seq=1, time_unix_s=KILLED_AT + 0.5)  # no event kind set
    dead = events_pb2.Record(seq=2, time_unix_s=KILLED_AT + 2.0,
                             event=events_pb2.Event(node_declared_dead=events_pb2.NodeDeclaredDead(node_id="n1")))
    measure_failure(failure, [unknown, dead])
    assert failure.detected_s == 2.0
