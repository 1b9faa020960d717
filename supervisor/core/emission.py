"""One decision's events as they are built, each with the seq it will be appended under.

Why it exists: a decision names records it has not appended yet. A quarantine names its evidence
(`NodeQuarantined.evidence_seq`: the Xid, hang, straggler, death or SDC record), and an SDC check
is named after its own record (`sdc-<seq>`). The shell appends a decision's events as one batch
right after `state.applied_seq` (the runtime's conditional append, `Core.records`), so an event's
seq is the base plus its place in the batch. Working that out by hand at each site
(`applied_seq + offset + len(events)`) silently names the wrong record the day an event is added
in front of the evidence, or a handler runs later in a composed step; here the call that places
an event is the one that hands out its seq, so the seq cannot name any other record.

An `Emission` is made by `decide` for one input (or one batch of Hellos) and owned by that call
alone; handlers add to it in the order the events are appended. It also keeps the base state
folded with what was added so far, which later handlers of the same step decide against.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from ftsup.supervisor.core.events import Event
from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.state import ClusterState

E = TypeVar("E", bound=Event)


class Emission:
    """The events of one decision in append order; `add` returns the seq an event will have."""

    __slots__ = ("_base", "_events", "_folded", "_folded_upto")

    def __init__(self, state: ClusterState) -> None:
        self._base = state
        self._events: list[Event] = []
        self._folded = state  # `_base` with the first `_folded_upto` events folded in
        self._folded_upto = 0

    @property
    def first_seq(self) -> int:
        """The seq the first event is appended under: the one after the state's last record."""
        return self._base.applied_seq + 1

    @property
    def next_seq(self) -> int:
        """The seq the next event added will be appended under."""
        return self.first_seq + len(self._events)

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def add(self, event: Event) -> int:
        """Appends `event` to the decision; returns the seq its record will have."""
        seq = self.next_seq
        self._events.append(event)
        return seq

    def add_numbered(self, build: Callable[[int], E]) -> E:
        """Appends the event `build` makes from its own seq (an SDC check named after its record)."""
        event = build(self.next_seq)
        self._events.append(event)
        return event

    def extend(self, events: Iterable[Event]) -> None:
        """Appends events that name no seq."""
        self._events.extend(events)

    def folded(self) -> ClusterState:
        """The base state with every event added so far folded in (what evolve will make of them;
        `applied_seq` stays the base's: nothing is appended yet)."""
        if self._folded_upto < len(self._events):
            self._folded = evolve_all(self._folded, self._events[self._folded_upto:])
            self._folded_upto = len(self._events)
        return self._folded
