"""Pure rendering for supervisorctl: proto replies -> text tables or JSON-ready dicts."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format

from ftsup.v1 import events_pb2, operator_pb2, state_pb2


def _enum_name(enum_type: Any, value: int, prefix: str) -> str:
    return str(enum_type.Name(value)).removeprefix(prefix).lower()


def status_dict(status: operator_pb2.GetStatusResponse) -> dict[str, Any]:
    return {
        "job": status.job_name,
        "phase": _enum_name(operator_pb2.JobPhase, status.phase, "JOB_PHASE_"),
        "generation": status.generation,
        "step": status.step,
        "world_size": status.world_size,
        "loss": status.loss if math.isfinite(status.loss) else None,
        "last_snapshot_step": status.last_snapshot_step if status.HasField("last_snapshot_step") else None,
        "last_checkpoint_step": status.last_checkpoint_step if status.HasField("last_checkpoint_step") else None,
        "ettr": status.ettr if status.HasField("ettr") else None,
        "head_seq": status.head_seq,
        "leader": status.leader_address,
        "nodes": {
            "alive": status.nodes_alive,
            "suspect": status.nodes_suspect,
            "dead": status.nodes_dead,
            "quarantined": status.nodes_quarantined,
            "spares_ready": status.spares_ready,
        },
        "waiting_reason": status.waiting_reason or None,
        "final_digest": status.final_digest or None,
        "degraded_reason": status.degraded_reason or None,
        "first_seq": status.first_seq,
        "restarts": status.restarts,
        "max_restarts": status.max_restarts if status.HasField("max_restarts") else None,
        "failure": status.failure or None,
        "failure_tail": status.failure_tail or None,
    }


def status_text(status: operator_pb2.GetStatusResponse) -> str:
    d = status_dict(status)
    loss = f"{d['loss']:.4f}" if d["loss"] is not None else "-"
    snap = d["last_snapshot_step"] if d["last_snapshot_step"] is not None else "-"
    ckpt = d["last_checkpoint_step"] if d["last_checkpoint_step"] is not None else "none"
    ettr = f"{d['ettr']:.1%}" if d["ettr"] is not None else "-"
    n = d["nodes"]
    lines = [
        f"job         {d['job']}  ({d['phase']})",
        f"generation  {d['generation']}   step {d['step']}   world {d['world_size']}   loss {loss}",
        f"snapshot    last committed step {snap}   checkpoint {ckpt}",
        f"goodput     ETTR {ettr}   (supervisorctl goodput: where the rest went)",
        f"nodes       {n['alive']} alive, {n['suspect']} suspect, {n['dead']} dead,"
        f" {n['quarantined']} quarantined, {n['spares_ready']} spare(s) ready",
        f"leader      {d['leader'] or 'unknown (election under way?)'}   log head seq {d['head_seq']}",
    ]
    if d["degraded_reason"]:
        lines.append(f"DEGRADED    {d['degraded_reason']}")
    if d["waiting_reason"]:
        lines.append(f"waiting     {d['waiting_reason']}")
    if d["final_digest"]:
        lines.append(f"final       parameter digest {d['final_digest']}")
    if d["restarts"] or d["max_restarts"] is not None:
        budget = "unlimited" if d["max_restarts"] is None else str(d["max_restarts"])
        lines.append(f"restarts    {d['restarts']} after failures (max {budget})")
    if d["failure"]:
        lines.append(f"FAILED      {d['failure']}")
        if d["failure_tail"]:
            lines.append("output      " + "\n            ".join(d["failure_tail"].splitlines()))
    return "\n".join(lines)


def node_dict(node: operator_pb2.NodeInfo) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "role": _enum_name(events_pb2.NodeRole, node.role, "NODE_ROLE_"),
        "liveness": _enum_name(state_pb2.Liveness, node.liveness, "LIVENESS_"),
        "quarantined": node.quarantined,
        "quarantine_reason": node.quarantine_reason or None,
        "ranks": list(node.ranks),
        "last_heartbeat_age_s": node.last_heartbeat_age_s if node.last_heartbeat_age_s >= 0 else None,
        "incarnation": node.incarnation,
        "host": node.host,
        "connected": node.connected,
        "xid_count": node.xid_count,
        "straggler_score": node.straggler_score,
        "failure_domain": node.failure_domain,
        "drained": node.drained,
        "snapshot_memory": _snapshot_memory(node),
    }


def _snapshot_memory(node: operator_pb2.NodeInfo) -> dict[str, Any] | None:
    """The agent's snapshot store limit (None: its agent has not reported one to this leader)."""
    if not node.HasField("snapshot_memory"):
        return None
    m = node.snapshot_memory
    return {"limit_bytes": m.limit_bytes, "derived_bytes": m.derived_bytes if m.HasField("derived_bytes") else None,
            "basis": m.basis, "ranks": m.ranks, "reason": m.reason}


def _mib(count: int) -> str:
    return f"{count / (1 << 20):,.0f}MiB" if count >= 1 << 20 else f"{count}B"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*headers), *(fmt.format(*r) for r in rows)]).rstrip()


def nodes_text(nodes: Sequence[operator_pb2.NodeInfo]) -> str:
    rows = []
    for node in nodes:
        d = node_dict(node)
        state = d["liveness"] + (" quarantined" if d["quarantined"] else "")
        age = f"{d['last_heartbeat_age_s']:.1f}s" if d["last_heartbeat_age_s"] is not None else "-"
        ranks = ",".join(str(r) for r in d["ranks"]) or "-"
        memory = d["snapshot_memory"]
        snap = f"{_mib(memory['limit_bytes'])} {memory['basis']}" if memory is not None else "-"
        rows.append([d["node_id"], d["role"], state, ranks, age, str(d["xid_count"]), f"{d['straggler_score']:.1f}",
                     snap, d["host"], d["quarantine_reason"] or ""])
    return table(["NODE", "ROLE", "STATE", "RANKS", "HEARTBEAT", "XIDS", "STRAGGLER", "SNAPSHOT MEM", "HOST", "REASON"],
                 rows)


def record_dict(record: events_pb2.Record) -> dict[str, Any]:
    kind = record.event.WhichOneof("kind") or "unknown"
    body = json_format.MessageToDict(
        getattr(record.event, kind), preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    ) if kind != "unknown" else {}
    return {"seq": record.seq, "term": record.term, "time_unix_s": record.time_unix_s, "kind": kind, **body}


def record_text(record: events_pb2.Record) -> str:
    d = record_dict(record)
    when = datetime.datetime.fromtimestamp(d["time_unix_s"], tz=datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
    skip = {"seq", "term", "time_unix_s", "kind", "members", "restores"}
    detail = " ".join(f"{k}={v}" for k, v in d.items() if k not in skip and v not in ("", [], None))
    if d["kind"] == "generation_started":
        members = "; ".join(
            f"{m['node_id']}:{','.join(str(r) for r in m.get('ranks', []))}" for m in d.get("members", [])
        )
        detail += f" members=[{members}]"
    return f"{d['seq']:>6}  {when}  {d['kind']:<20} {detail}"
