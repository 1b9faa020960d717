"""Refused inputs are logged one by one while few, then counted (supervisor/refusal_log.py)."""

from __future__ import annotations

from typing import Any

from ftsup.supervisor.refusal_log import RefusalLog


class _Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def test_a_burst_past_the_window_s_budget_is_counted_and_said_in_one_line_at_the_window_s_end():
    lines = _Lines()
    refusals = RefusalLog(lines, per_window=3, window_s=10.0)
    for i in range(8):
        refusals.refused("StepAggregate", f"rank {i}: stale generation 1", 100.0 + i * 0.1, node_id=f"n{i}",
                         generation=None)
    refusals.refused("SnapshotHoldings", "stale", 101.0, node_id="h", generation=None)
    assert [fields["node_id"] for _, fields in lines.lines] == ["n0", "n1", "n2"]
    refusals.roll(109.9, None)  # (the window is not over)
    assert len(lines.lines) == 3
    refusals.roll(110.0, 2)
    event, fields = lines.lines[-1]
    assert event == "inputs refused, not logged one by one"
    assert fields["counts"] == {"StepAggregate": 5, "SnapshotHoldings": 1}
    assert fields["last_reasons"]["StepAggregate"] == "rank 7: stale generation 1"
    assert fields["last_node_ids"] == {"StepAggregate": "n7", "SnapshotHoldings": "h"}
    assert fields["generation"] == 2 and fields["logged"] == 3
    refusals.roll(130.0, 2)  # said once
    assert len(lines.lines) == 4
    refusals.refused("Heartbeat", "no Hello", 131.0, node_id="x", generation=2)  # a new window
    assert lines.lines[-1] == ("input refused", {"input": "Heartbeat", "reason": "no Hello", "node_id": "x",
                                                 "generation": 2})


def test_few_refusals_are_each_a_line_and_leave_no_summary():
    lines = _Lines()
    refusals = RefusalLog(lines, per_window=3, window_s=10.0)
    for t in (0.0, 5.0, 11.0, 12.0):  # the third opens a new window
        refusals.refused("StepReport", "bad", t, node_id="n", generation=1)
        refusals.roll(t + 0.5, 1)
    refusals.roll(100.0, 1)
    assert [event for event, _ in lines.lines] == ["input refused"] * 4
