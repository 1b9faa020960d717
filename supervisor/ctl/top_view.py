"""What `supervisorctl top` shows, as pure functions: Operator replies -> one frame's data -> lines.

Kept apart from the loop (top.py) so a test can build a frame from canned replies and check the
text at any terminal size. A frame is plain data (what `top --once --json` prints): the job's
status, a step rate, node counts per state, the fleet grouped by failure domain, the last events.

Sizing rule: the header wraps its fields rather than cutting them; the node grid shrinks by
letting one cell stand for several nodes (showing the most urgent state among them) until it fits
the rows left after the header and a few event lines; every line is cut to the terminal's width.
"""

from __future__ import annotations

import datetime
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ftsup.supervisor.ctl import render
from ftsup.v1 import events_pb2, operator_pb2, state_pb2

# The status page's words for a node (supervisor/web/feed.py STATES), in that order.
STATES = ("active", "spare", "suspect", "dead", "quarantined", "drained")
# A cell standing for several nodes shows the first of these among them.
URGENCY = ("dead", "suspect", "quarantined", "drained", "active", "spare")
GLYPH = {"active": "#", "spare": ".", "suspect": "?", "dead": "X", "quarantined": "Q", "drained": "D"}
COLOUR = {"active": "32", "spare": "36", "suspect": "33;1", "dead": "31;1", "quarantined": "35", "drained": "34"}
# Records a terminal's few event lines would drown in (the status page hides them too).
QUIET_KINDS = frozenset({"snapshot_committed", "checkpoint_shard_written"})
MIN_EVENT_ROWS = 3
RATE_WINDOW_S = 30.0  # step rate: the steps made over about this much of the newest history


def node_state(node: operator_pb2.NodeInfo, has_generation: bool) -> str:
    """One word per node, the most urgent that applies (the status page's rule): liveness, then a
    verdict that holds it out, then its place (in the generation in force, or spare capacity)."""
    if node.liveness == state_pb2.LIVENESS_DEAD:
        return "dead"
    if node.liveness == state_pb2.LIVENESS_SUSPECT:
        return "suspect"
    if node.quarantined:
        return "quarantined"
    if node.drained:
        return "drained"
    if node.ranks or (not has_generation and node.role == events_pb2.NODE_ROLE_ACTIVE):
        return "active"
    return "spare"


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds (wall clock of whoever took it)
    generation: int
    step: int


class StepRate:
    """Steps per second over the newest RATE_WINDOW_S of samples within one generation.

    Live samples are taken from each frame's status; before two of them span a second, the
    SnapshotCommitted records (step and commit time) stand in, so a single frame has a rate too."""

    def __init__(self) -> None:
        self.samples: deque[Sample] = deque(maxlen=256)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def rate(self, seeds: Iterable[Sample] = ()) -> float | None:
        live = _rate(list(self.samples))
        return live if live is not None else _rate(sorted(seeds, key=lambda s: s.t))


def _rate(samples: Sequence[Sample]) -> float | None:
    if not samples:
        return None
    last = samples[-1]
    window = [s for s in samples if s.generation == last.generation and last.t - s.t <= RATE_WINDOW_S]
    first = window[0]
    if last.t - first.t < 1.0 or last.step < first.step:
        return None
    return (last.step - first.step) / (last.t - first.t)


def snapshot_samples(records: Iterable[events_pb2.Record]) -> list[Sample]:
    return [Sample(r.time_unix_s, r.event.snapshot_committed.generation, r.event.snapshot_committed.step)
            for r in records if r.event.WhichOneof("kind") == "snapshot_committed"]


def frame(status: operator_pb2.GetStatusResponse, nodes: Sequence[operator_pb2.NodeInfo],
          records: Sequence[events_pb2.Record], step_rate: float | None, now_unix_s: float,
          keep_events: int = 50) -> dict[str, Any]:
    """One frame's data: what `top --once --json` prints and what `lines` draws."""
    has_generation = any(n.ranks for n in nodes)
    states = {n.node_id: node_state(n, has_generation) for n in nodes}
    counts = dict.fromkeys(STATES, 0)
    for state in states.values():
        counts[state] += 1
    groups: dict[str, list[list[str]]] = {}
    for node in sorted(nodes, key=lambda n: (n.failure_domain, n.node_id)):
        groups.setdefault(node.failure_domain, []).append([node.node_id, states[node.node_id]])
    shown = [r for r in records if (r.event.WhichOneof("kind") or "") not in QUIET_KINDS][-keep_events:]
    return {
        "t": now_unix_s,
        "status": render.status_dict(status),
        "step_rate": step_rate,
        "counts": counts,
        "groups": [{"domain": domain, "nodes": members} for domain, members in groups.items()],
        "events": [render.record_dict(r) for r in shown],
    }


def _pack(fields: Sequence[str], width: int) -> list[str]:
    """Fields joined by two spaces, wrapped onto as many lines as the width needs."""
    lines: list[str] = []
    for text in fields:
        if lines and len(lines[-1]) + 2 + len(text) <= width:
            lines[-1] += "  " + text
        else:
            lines.append(text)
    return lines


def header_lines(data: dict[str, Any], width: int) -> list[str]:
    s = data["status"]
    rate = data["step_rate"]
    when = datetime.datetime.fromtimestamp(data["t"], tz=datetime.UTC).strftime("%H:%M:%S UTC")
    lines = _pack([f"ftsup top  {s['job'] or '(no job)'}", s["phase"].upper(), when], width)
    lines += _pack([
        f"gen {s['generation']}", f"step {s['step']:,}",
        f"{rate:.2f} steps/s" if rate is not None else "- steps/s",
        f"loss {s['loss']:.4f}" if s["loss"] is not None else "loss -",
        f"ETTR {s['ettr']:.1%}" if s["ettr"] is not None else "ETTR -",
        f"restarts {s['restarts']}" + (f"/{s['max_restarts']}" if s["max_restarts"] is not None else ""),
    ], width)
    counts = data["counts"]
    total = sum(counts.values())
    lines += _pack([f"nodes {total}:", *(f"{counts[name]} {name}" for name in STATES),
                    f"leader {s['leader'] or '?'}", f"seq {s['head_seq']}"], width)
    for label, key in (("DEGRADED", "degraded_reason"), ("waiting", "waiting_reason"), ("FAILED", "failure")):
        if s[key]:
            lines.append(f"{label}  {s[key]}")
    return lines


@dataclass(frozen=True, slots=True)
class GridRow:
    label: str
    cells: tuple[str, ...]  # a state per cell


def grid_rows(groups: Sequence[dict[str, Any]], width: int, max_rows: int) -> tuple[list[GridRow], int]:
    """The fleet's rows (one or more per failure domain) and how many nodes one cell stands for."""
    domains = [g["domain"] for g in groups]
    label_w = min(max((len(d) for d in domains), default=0), width // 4) if any(domains) and width >= 30 else 0
    cols = max(1, width - (label_w + 1 if label_w else 0))
    sizes = [len(g["nodes"]) for g in groups]
    per_cell = 1
    while per_cell < max(sizes, default=1) and sum(
            math.ceil(math.ceil(n / per_cell) / cols) for n in sizes) > max(1, max_rows):
        per_cell *= 2
    rows: list[GridRow] = []
    for group in groups:
        states = [state for _, state in group["nodes"]]
        cells = tuple(min(states[i:i + per_cell], key=URGENCY.index) for i in range(0, len(states), per_cell))
        for start in range(0, len(cells), cols):
            label = group["domain"][:label_w] if start == 0 else ""
            rows.append(GridRow(label.ljust(label_w), cells[start:start + cols]))
    return rows[:max(1, max_rows)], per_cell


def _cells(cells: Sequence[str], colour: bool) -> str:
    if not colour:
        return "".join(GLYPH[c] for c in cells)
    out, current = [], ""
    for cell in cells:  # an escape only where the colour changes: 12,500 cells stay a small frame
        if cell != current:
            out.append(f"\x1b[{COLOUR[cell]}m")
            current = cell
        out.append(GLYPH[cell])
    return "".join(out) + ("\x1b[0m" if cells else "")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def lines(data: dict[str, Any], width: int, height: int, colour: bool = False) -> list[str]:
    """The frame as at most `height` lines of at most `width` visible characters."""
    width, height = max(20, width), max(8, height)
    top = [_cut(line, width) for line in header_lines(data, width)]
    legend = "  ".join(f"{GLYPH[s]} {s}" for s in STATES)
    grid_budget = height - len(top) - 1 - 2 - 1 - MIN_EVENT_ROWS  # blank, legend, blank, "events"
    rows, per_cell = grid_rows(data["groups"], width, grid_budget)
    if per_cell > 1:  # first, so a narrow terminal cuts the legend's tail, not this
        legend = f"1 cell = {per_cell} nodes, worst shown  {legend}"
    out = [*top, ""]
    for row in rows:
        out.append((row.label + " " if row.label else "") + _cells(row.cells, colour))
    out += [_cut(legend, width), "", "events"]
    room = max(0, height - len(out))
    events = data["events"][-room:] if room else []
    out += [_cut(_event_text(e), width) for e in events]
    return out[:height]


def _event_text(event: dict[str, Any]) -> str:
    when = datetime.datetime.fromtimestamp(event["time_unix_s"], tz=datetime.UTC).strftime("%H:%M:%S")
    skip = {"seq", "term", "time_unix_s", "kind", "members", "restores"}
    detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in skip and v not in ("", [], None, 0, "0"))
    return f"{event['seq']:>6} {when} {event['kind']} {detail}".rstrip()
