"""What the status page is sent: the fleet, the job's summary and the event records, as JSON.

Read-only views of the runtime's state and of the event log, shaped for a browser holding 12,500
nodes: the fleet travels as parallel arrays (ids, failure domains, state codes) rather than one
object per node, and a record's field that lists the world (a GenerationStarted's members) is
cut to its count, so no message grows with the fleet except the fleet itself.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ftsup.supervisor.core.events import NodeRole, Record
from ftsup.supervisor.core.state import ClusterState, Liveness, NodeRecord
from ftsup.supervisor.server.log_digest import LogDigest

if TYPE_CHECKING:
    from ftsup.supervisor.runtime import Runtime

# The order is the wire code the page colours by (static/status.js STATES must match).
STATES = ("active", "spare", "suspect", "dead", "quarantined", "drained")
STATE_CODE = {name: code for code, name in enumerate(STATES)}
LIST_CUT = 8  # a tuple field longer than this travels as its length
TEXT_CUT = 400  # characters of a free-text field


def node_state(node: NodeRecord, members: Mapping[str, Any]) -> str:
    """One word per node, the most urgent that applies: liveness first (a dead node is red while it
    is gone, though the supervisor quarantines it at once), then an operator-facing verdict
    (quarantined, drained: a node that came back but is held out), then its place: a member of
    the generation in force is active; any other live node is spare capacity, whatever role it
    registered with."""
    if node.liveness is Liveness.DEAD:
        return "dead"
    if node.liveness is Liveness.SUSPECT:
        return "suspect"
    if node.is_quarantined:
        return "quarantined"
    if node.is_drained:
        return "drained"
    if node.node_id in members or (not members and node.role is NodeRole.ACTIVE):
        return "active"
    return "spare"


def fleet_codes(state: ClusterState) -> dict[str, int]:
    """node id -> state code, for every node the state knows."""
    members = {m.node_id: m for m in state.generation.members} if state.generation else {}
    return {node_id: STATE_CODE[node_state(node, members)] for node_id, node in state.nodes.items()}


def fleet(state: ClusterState) -> dict[str, Any]:
    """The whole fleet, sorted by (failure domain, node id): the page lays domains out in blocks."""
    nodes = sorted(state.nodes.values(), key=lambda n: (n.failure_domain, n.node_id))
    codes = fleet_codes(state)
    return {
        "states": list(STATES),
        "ids": [n.node_id for n in nodes],
        "domains": [n.failure_domain for n in nodes],
        "codes": [codes[n.node_id] for n in nodes],
    }


def fleet_changes(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int] | None:
    """node id -> new code for nodes whose code changed; None when a node appeared or vanished
    (the page then needs the whole fleet again, since its layout changes)."""
    if before.keys() != after.keys():
        return None
    return {node_id: code for node_id, code in after.items() if before[node_id] != code}


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value) <= TEXT_CUT else value[:TEXT_CUT] + "…"
    if isinstance(value, tuple | list):
        if len(value) > LIST_CUT:
            return {"count": len(value)}
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    return value


def record_json(record: Record) -> dict[str, Any]:
    """A record for the timeline: kind, place, the node and generation it concerns, its fields."""
    event = record.event
    fields = _plain(event)
    node = getattr(event, "node_id", None) or getattr(event, "suspect_node_id", None) or ""
    return {
        "seq": record.seq,
        "term": record.term,
        "t": record.time_unix_s,
        "kind": type(event).__name__,
        "node": node,
        "generation": getattr(event, "generation", None),
        "fields": fields,
    }


def node_json(runtime: Runtime, node_id: str) -> dict[str, Any] | None:
    """One node's details as the page shows them on click; None for an unknown node."""
    record = runtime.state.nodes.get(node_id)
    if record is None:
        return None
    view = next((v for v in runtime.nodes() if v.node_id == node_id), None)
    members = {m.node_id: m for m in runtime.state.generation.members} if runtime.state.generation else {}
    details = _plain(record)
    details["state"] = node_state(record, members)
    if view is not None:
        details.update(ranks=list(view.ranks), last_heartbeat_age_s=_plain(view.last_heartbeat_age_s),
                       is_connected=view.is_connected)
    return details


def recent_records(records: Iterable[Record], node_id: str = "", limit: int = 50) -> list[dict[str, Any]]:
    """The newest `limit` records (about `node_id` when given), oldest first."""
    kept: list[dict[str, Any]] = []
    for record in records:
        item = record_json(record)
        if node_id and item["node"] != node_id and node_id not in str(item["fields"].get("culprit_node_ids", "")):
            continue
        kept.append(item)
        if len(kept) > 2 * limit:
            del kept[:limit]
    return kept[-limit:]


def summary(runtime: Runtime, digest: LogDigest) -> dict[str, Any]:
    """The job at a glance: progress, throughput, goodput, leadership and the ages of saved state.

    `digest` must have caught up with the log (the caller awaits that)."""
    now = runtime.wall_now()
    status = runtime.status()
    metrics = runtime.metrics
    report = digest.goodput(now)
    snapshot = digest.snapshot_unix_s
    checkpoint = digest.checkpoint_unix_s
    stragglers = sorted(((v.straggler_score, v.node_id) for v in runtime.nodes() if v.straggler_score), reverse=True)
    return {
        "t": now,
        "job": status.job_name,
        "phase": status.phase.value,
        "generation": status.generation,
        "step": status.step,
        "world_size": status.world_size,
        "loss": _plain(status.loss),
        "grad_norm": _plain(metrics._grad_norm) if metrics is not None else None,
        "tokens_per_s": _plain(metrics.tokens_per_s()) if metrics is not None else None,
        "mfu": _plain(metrics.mfu(status.world_size)) if metrics is not None else None,
        "head_seq": status.head_seq,
        "waiting_reason": status.waiting_reason,
        "is_leader": runtime.is_leader,
        "term": runtime.term,
        "leader": runtime.leader_address,
        "degraded": runtime.degraded_reason,
        "goodput": {
            "wall_s": report.wall_s,
            "productive_s": report.productive_s,
            "detection_s": report.detection_s,
            "restart_s": report.restart_s,
            "lost_work_s": report.lost_work_s,
            "waiting_s": report.waiting_s,
            "ettr": _plain(report.ettr) if report.ettr is not None else None,
            "lost_steps": report.lost_steps,
            "interruptions": report.interruptions,
            "by_reason": dict(report.interruptions_by_reason),
        },
        "snapshot": {"step": snapshot[0], "age_s": max(0.0, now - snapshot[1])} if snapshot else None,
        "checkpoint": {"id": checkpoint[0], "age_s": max(0.0, now - checkpoint[1])} if checkpoint else None,
        "stragglers": [{"node": node, "score": _plain(score)} for score, node in stragglers[:10]],
    }


# Records a timeline would drown in: one per shard of every checkpoint (the commit says it all),
# and one per committed RAM snapshot (every few steps; the summary carries the newest and its age).
QUIET_KINDS = frozenset({"CheckpointShardWritten", "SnapshotCommitted"})
