"""A batch's registrations are one log line naming every node; every other record a line each, in order."""

from __future__ import annotations

from typing import Any

from ftsup.supervisor.core.events import JobCompleted, NodeCleared, NodeRegistered, NodeRole, Record
from ftsup.supervisor.event_lines import EventLines


class _Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def _registered(seq: int, node: str) -> Record:
    return Record(seq, 1, 1.0, NodeRegistered(node, 1, NodeRole.ACTIVE, "h", 1, 8))


def test_a_batchs_registrations_are_one_line_before_the_next_records_line_and_a_lone_one_keeps_its_own() -> None:
    logger = _Lines()
    lines = EventLines(logger)
    for seq in range(1, 4):
        lines.add(_registered(seq, f"node-{seq}"), generation=None)
    assert logger.lines == [], "held until the append's records are all applied"
    lines.add(Record(4, 1, 1.0, NodeCleared("node-9", "repaired")), generation=2)
    lines.flush()
    lines.add(_registered(5, "node-5"), generation=2)
    lines.flush()
    lines.add(Record(6, 1, 1.0, JobCompleted(7, 100, "ab")), generation=2)
    assert logger.lines == [
        ("events", {"kind": "NodeRegistered", "count": 3, "first_seq": 1, "last_seq": 3, "generation": None,
                    "node_ids": ["node-1", "node-2", "node-3"], "gpus": 24}),
        ("event", {"seq": 4, "kind": "NodeCleared", "generation": 2, "node_id": "node-9", "reason": "repaired"}),
        ("event", {"seq": 5, "kind": "NodeRegistered", "generation": 2, "node_id": "node-5", "incarnation": 1,
                   "role": "active", "host": "h", "peer_port": 1, "gpus": 8, "failure_domain": ""}),
        ("event", {"seq": 6, "kind": "JobCompleted", "generation": 7, "step": 100, "param_digest": "ab"}),
    ]
