"""The log-context checker (tests/support/log_context.py) catches what it is meant to catch, and the
processor that reads a `Live` bound value writes what it reads when the line is written."""

from __future__ import annotations

import io
import json

import structlog

from ftsup.common import logs
from tests.support.log_context import agent_problems, supervisor_problems


def lines(*records: dict[str, object]) -> list[tuple[int, dict[str, object]]]:
    return list(enumerate(records, 1))


def test_a_supervisor_line_about_a_node_without_the_generation_in_force_is_named() -> None:
    good = lines(
        {"event": "node connected", "node_id": "n1", "generation": None},
        {"event": "event", "kind": "GenerationStarted", "generation": 1},
        {"event": "event", "kind": "NodeDeclaredDead", "node_id": "n2", "generation": 1},
        {"event": "event", "kind": "GenerationEnded", "node_id": "n2", "generation": 1},
        {"event": "event", "kind": "JobCompleted", "generation": 1},
        {"event": "node stream closed", "node_id": "n2", "generation": None},
        {"event": "waiting", "reason": "2 of 3 nodes"},  # about no node: no generation needed
    )
    assert supervisor_problems(good) == []
    replayed = lines({"event": "state replayed", "generation": 3},
                     {"event": "input refused", "node_id": "n1", "generation": 3},
                     {"event": "following", "generation": 5},
                     {"event": "leading", "generation": None},
                     {"event": "node connected", "node_id": "n1", "generation": None})
    assert supervisor_problems(replayed) == []
    missing = lines({"event": "event", "kind": "GenerationStarted", "generation": 4},
                    {"event": "node stream closed", "node_id": "n2"},
                    {"event": "input refused", "verifier_node_id": "n3", "generation": None})
    problems = supervisor_problems(missing)
    assert len(problems) == 2
    assert problems[0].startswith("line 2: no generation (in force: 4)")
    assert problems[1].startswith("line 3: generation None, in force 4")


def test_an_agent_line_without_its_node_or_a_generation_is_named() -> None:
    assert agent_problems("n1", lines({"event": "welcomed", "node_id": "n1", "generation": None},
                                      {"event": "restore_ready", "node_id": "n1", "generation": 2, "rank": 0})) == []
    problems = agent_problems("n1", lines({"event": "xid", "node_id": "n1"},
                                          {"event": "restore_ready", "node_id": "n1", "generation": None, "rank": 3},
                                          {"event": "welcomed", "generation": None}))
    assert [p.split(":")[0] for p in problems] == ["line 1", "line 2", "line 3"]


def test_a_live_bound_value_is_read_when_each_line_is_written() -> None:
    out = io.StringIO()
    saved = structlog.get_config()
    logs.configure(json=True, stream=out)
    try:
        current = logs.Live(lambda: None)
        log = logs.get("test", node_id="n1", generation=current).bind(part="x")
        log.info("idle")
        current.read = lambda: 7
        log.info("running")
        log.info("about another generation", generation=6)
    finally:
        structlog.configure(**saved)
    written = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(w["event"], w["generation"]) for w in written] == [
        ("idle", None), ("running", 7), ("about another generation", 6)]
    assert repr(current) == "7"
