"""Checks that every structured log line about a node names the node and the generation.

The rule (common/logs.py): a line that mentions a node (a `node_id`, any `*_node_id(s)` key, or
a `rank`) carries `generation`, null only while none is in force. For a supervisor's log the
generation in force is known exactly: one process writes its lines in order and, while it leads,
logs an `event` line as each record is applied, so the last GenerationStarted not yet followed by
its GenerationEnded is the one every later line must name. Records folded without a line (replayed
at start, followed as a replica) are summed up by the generation on "state replayed", "leading" and
"following". An agent's lines all name its node; the
generation is the one it runs (null while none), and a line naming a rank must name one.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Iterator
from typing import Any


def json_lines(path: pathlib.Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each JSON object line; other output (a library's warnings) is skipped."""
    for number, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not text.startswith("{"):
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "event" in record:
            yield number, record


def mentions_node(record: dict[str, Any]) -> bool:
    return any(key in ("rank", "node_id") or key.endswith(("_node_id", "_node_ids")) for key in record)


def supervisor_problems(lines: Iterable[tuple[int, dict[str, Any]]]) -> list[str]:
    """Each node-related supervisor line without the generation in force when it was written."""
    problems = []
    in_force: int | None = None
    last: int | None = None  # JobCompleted names the last generation, ended just before it
    for number, record in lines:
        kind = record.get("kind") if record["event"] == "event" else None
        if record["event"] in ("state replayed", "leading", "following"):
            in_force = record.get("generation")
            last = in_force if in_force is not None else last
        if kind == "GenerationStarted":
            in_force = last = record.get("generation")
        expected = last if kind == "JobCompleted" else in_force
        if mentions_node(record) or kind is not None:
            if "generation" not in record:
                problems.append(f"line {number}: no generation (in force: {expected}): {record}")
            elif record["generation"] != expected:
                problems.append(f"line {number}: generation {record['generation']}, in force {expected}: {record}")
        if kind == "GenerationEnded":
            in_force = None
    return problems


def agent_problems(node_id: str, lines: Iterable[tuple[int, dict[str, Any]]]) -> list[str]:
    """Each agent line that does not name its node and a generation key (set when it names a rank)."""
    problems = []
    for number, record in lines:
        if record.get("node_id") != node_id:
            problems.append(f"line {number}: node_id {record.get('node_id')!r}, not {node_id!r}: {record}")
        if "generation" not in record:
            problems.append(f"line {number}: no generation: {record}")
        elif "rank" in record and not record["generation"]:
            problems.append(f"line {number}: names rank {record['rank']} but no generation: {record}")
    return problems
