"""Appended records in the supervisor's log: a line each, but a batch's registrations in one.

Every record the leader appends gets an info line ("event", its seq, kind and fields) so that an
operator reading the journal sees what was decided and when, beside what led to it. A fleet's
registration is the exception: 12,500 NodeRegistered records arrive in batches of Hellos, and a
line each cost ~3.5 s of the leader's loop in an 82 s profiled registration (issue 14, part 17),
while the journal filled with the same line 12,500 times. Registrations of one append are held
and logged as one "events" line naming every node (a grep for a node still finds it); the full
records stay in the event log (`supervisorctl events`). Order is kept: held registrations are
logged before any later record's line.
"""

from __future__ import annotations

import enum
from typing import Any

from ftsup.supervisor.core.events import NodeRegistered, Record


class EventLines:
    """Owned by the runtime: `add` each record as it is applied, `flush` once an append's records
    are all applied."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger
        self._registered: list[Record] = []  # this append's NodeRegistered, not logged yet
        self._generation: int | None = None

    def add(self, record: Record, generation: int | None) -> None:
        if isinstance(record.event, NodeRegistered):
            self._registered.append(record)
            self._generation = generation
            return
        self.flush()
        self._logger.info("event", seq=record.seq, kind=type(record.event).__name__,
                          **{"generation": generation, **event_fields(record.event)})

    def flush(self) -> None:
        held, self._registered = self._registered, []
        if len(held) == 1:
            self._logger.info("event", seq=held[0].seq, kind="NodeRegistered",
                              **{"generation": self._generation, **event_fields(held[0].event)})
        elif held:
            events = [record.event for record in held if isinstance(record.event, NodeRegistered)]
            self._logger.info(
                "events", kind="NodeRegistered", count=len(held), first_seq=held[0].seq,
                last_seq=held[-1].seq, generation=self._generation,
                node_ids=[event.node_id for event in events],
                gpus=sum(event.gpus for event in events),
            )


def event_fields(event: object) -> dict[str, object]:
    """An event's fields for its line: enums by value, without the per-node lists of a generation
    (its members and restores: 12,500 entries each at the design's size)."""
    names = getattr(event, "__slots__", ())
    fields = {name: getattr(event, name) for name in names if name != "members" and name != "restores"}
    return {name: value.value if isinstance(value, enum.Enum) else value for name, value in fields.items()}
