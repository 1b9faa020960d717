"""Pure rendering of supervisorctl's job-wide views: goodput, stragglers, checkpoints, and which
generation ran a given step (the experiment record). Proto replies in, text or JSON-ready dicts out.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ftsup.supervisor.ctl.render import record_dict, table
from ftsup.v1 import events_pb2, operator_pb2

BUCKETS = (
    ("productive", "productive_s", "steps that survived"),
    ("detection", "detection_s", "failed, no verdict yet"),
    ("restart", "restart_s", "generation starting: launch, restore, first step"),
    ("lost work", "lost_work_s", "steps redone after a restore"),
    ("waiting", "waiting_s", "no generation: waiting for nodes or a verdict"),
)


def _when(unix_s: float | None) -> str | None:
    if unix_s is None:
        return None
    return datetime.datetime.fromtimestamp(unix_s, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{sec:02d}s"


def goodput_dict(reply: operator_pb2.GetGoodputResponse) -> dict[str, Any]:
    return {
        "ettr": reply.ettr if reply.HasField("ettr") else None,
        "wall_s": reply.wall_s,
        "buckets_s": {key.removesuffix("_s"): getattr(reply, key) for _, key, _ in BUCKETS},
        "checkpoint_pause_s": reply.checkpoint_pause_s if reply.HasField("checkpoint_pause_s") else None,
        "unsaved_s": reply.unsaved_s,
        "generations": reply.generations,
        "interruptions": reply.interruptions,
        "interruptions_by_reason": {r.reason: r.count for r in reply.interruptions_by_reason},
        "lost_steps": reply.lost_steps,
        "since_unix_s": reply.since_unix_s if reply.HasField("since_unix_s") else None,
        "until_unix_s": reply.until_unix_s,
        "first_seq": reply.first_seq,
        "notes": list(reply.notes),
    }


def goodput_text(reply: operator_pb2.GetGoodputResponse) -> str:
    d = goodput_dict(reply)
    if d["ettr"] is None:
        return "goodput     no generation has started yet: nothing to account"
    lines = [f"goodput     ETTR {d['ettr']:.1%} over {_duration(d['wall_s'])} (since {_when(d['since_unix_s'])})"]
    wall = d["wall_s"] or 1.0
    rows = [[name, f"{getattr(reply, key):.1f}", f"{getattr(reply, key) / wall:.1%}", what] for name, key, what in BUCKETS]
    pause = "not measured" if d["checkpoint_pause_s"] is None else f"{d['checkpoint_pause_s']:.1f}"
    rows.append(["checkpoint", pause, "-", "pauses for object-store checkpoints"])
    lines.append(table(["BUCKET", "SECONDS", "SHARE", "WHAT"], rows))
    reasons = ", ".join(f"{r} {n}" for r, n in d["interruptions_by_reason"].items())
    lines.append(f"generations {d['generations']}   interruptions {d['interruptions']}"
                 + (f" ({reasons})" if reasons else "") + f"   steps redone {d['lost_steps']}")
    lines.append(f"at risk     {_duration(d['unsaved_s'])} of work since the last committed snapshot")
    lines.extend(f"note        {n}" for n in d["notes"])
    return "\n".join(lines)


def goodput_prometheus(reply: operator_pb2.GetGoodputResponse, job: str) -> str:
    """Prometheus text exposition (for node_exporter's textfile collector or a push gateway)."""
    d = goodput_dict(reply)
    label = job.replace("\\", "\\\\").replace('"', '\\"')
    out = [
        "# HELP ftsup_goodput_ettr Effective training time ratio: productive time / wall time.",
        "# TYPE ftsup_goodput_ettr gauge",
    ]
    if d["ettr"] is not None:
        out.append(f'ftsup_goodput_ettr{{job="{label}"}} {d["ettr"]:.6f}')
    out += ["# HELP ftsup_goodput_seconds Wall time by bucket since the first generation started.",
            "# TYPE ftsup_goodput_seconds gauge"]
    out += [f'ftsup_goodput_seconds{{job="{label}",bucket="{name}"}} {value:.3f}' for name, value in d["buckets_s"].items()]
    out += ["# HELP ftsup_goodput_wall_seconds Wall time accounted.", "# TYPE ftsup_goodput_wall_seconds gauge",
            f'ftsup_goodput_wall_seconds{{job="{label}"}} {d["wall_s"]:.3f}',
            "# HELP ftsup_goodput_lost_steps Training steps done and then thrown away by a restore.",
            "# TYPE ftsup_goodput_lost_steps gauge", f'ftsup_goodput_lost_steps{{job="{label}"}} {d["lost_steps"]}',
            "# HELP ftsup_goodput_interruptions Generations that ended other than by completing.",
            "# TYPE ftsup_goodput_interruptions gauge"]
    out += [f'ftsup_goodput_interruptions{{job="{label}",reason="{r}"}} {n}' for r, n in d["interruptions_by_reason"].items()]
    return "\n".join(out)


def stragglers_dict(reply: operator_pb2.ListStragglersResponse) -> dict[str, Any]:
    return {
        "generation": reply.generation or None,
        "policy": {"flag_z": reply.flag_z, "flag_min_over": reply.flag_min_over, "window_steps": reply.window_steps},
        "ranks": [
            {"rank": r.rank, "node_id": r.node_id, "last_score": r.last_score, "window_steps": r.window_steps,
             "over_threshold": r.over_threshold, "flagged": r.flagged}
            for r in reply.ranks
        ],
        "detections": [record_dict(r) for r in reply.detections],
    }


def stragglers_text(reply: operator_pb2.ListStragglersResponse) -> str:
    d = stragglers_dict(reply)
    policy = d["policy"]
    lines = [f"policy      flag a rank when {policy['flag_min_over']} of its last {policy['window_steps']}"
             f" compute-time scores reach z >= {policy['flag_z']:g}"]
    if not d["ranks"]:
        why = "no generation in force" if d["generation"] is None else "no step scored yet in this generation"
        lines.append(f"scores      none ({why})")
    else:
        rows = [[str(r["rank"]), r["node_id"], f"{r['last_score']:.2f}", f"{r['over_threshold']}/{r['window_steps']}",
                 "FLAGGED" if r["flagged"] else ""] for r in d["ranks"]]
        lines.append(f"generation  {d['generation']}")
        lines.append(table(["RANK", "NODE", "SCORE", "OVER", "STATE"], rows))
    if d["detections"]:
        lines.append("detections (newest last):")
        rows = [[str(x["seq"]), x["node_id"], str(x["rank"]), f"{x['score']:.2f}", x["detail"]] for x in d["detections"]]
        lines.append(table(["SEQ", "NODE", "RANK", "SCORE", "DETAIL"], rows))
    else:
        lines.append("detections  none")
    return "\n".join(lines)


# The reply's `optional` fields: absent means unknown (no snapshot yet, no interval decided), not 0.
_OptionalField = Literal["snapshot_step", "snapshot_unix_s", "checkpoint_step", "checkpoint_unix_s", "interval_s"]


def checkpoints_dict(reply: operator_pb2.ListCheckpointsResponse) -> dict[str, Any]:
    def opt(name: _OptionalField) -> int | float | None:
        return getattr(reply, name) if reply.HasField(name) else None

    return {
        "snapshot": None if opt("snapshot_step") is None else {
            "step": reply.snapshot_step, "generation": reply.snapshot_generation,
            "committed_unix_s": opt("snapshot_unix_s")},
        "checkpoint": None if not reply.checkpoint_id else {
            "checkpoint_id": reply.checkpoint_id, "step": opt("checkpoint_step"),
            "manifest_key": reply.checkpoint_manifest, "committed_unix_s": opt("checkpoint_unix_s")},
        "pending": None if not reply.pending_checkpoint_id else {
            "checkpoint_id": reply.pending_checkpoint_id, "step": reply.pending_step,
            "shards": reply.pending_shards, "written": reply.pending_written},
        "requested": None if not reply.requested_checkpoint_id else {
            "checkpoint_id": reply.requested_checkpoint_id, "step": reply.requested_step,
            "reason": reply.requested_reason},
        "cadence": reply.cadence,
        "interval": {"seconds": opt("interval_s"), "reason": reply.interval_reason},
    }


def checkpoints_text(reply: operator_pb2.ListCheckpointsResponse) -> str:
    d = checkpoints_dict(reply)
    snap, ckpt, pending, interval = d["snapshot"], d["checkpoint"], d["pending"], d["interval"]
    requested = d["requested"]
    at = lambda unix_s: f" at {_when(unix_s)}" if unix_s is not None else ""  # noqa: E731
    lines = [
        "RAM snapshot   " + (f"step {snap['step']} (generation {snap['generation']}){at(snap['committed_unix_s'])}"
                             if snap else "none committed yet"),
        "checkpoint     " + (f"{ckpt['checkpoint_id']} step {ckpt['step']}{at(ckpt['committed_unix_s'])}"
                             f" manifest {ckpt['manifest_key']}" if ckpt else "none committed"),
        "in flight      " + (f"{pending['checkpoint_id']} step {pending['step']}: {pending['written']}"
                             f" of {pending['shards']} shards written" if pending else "none"),
        "requested      " + (f"{requested['checkpoint_id']} at step {requested['step']}: {requested['reason']}"
                             if requested else "none"),
        "cadence        " + (d["cadence"] or "-"),
        "interval       " + (f"{interval['seconds']:.0f}s: {interval['reason']}" if interval["seconds"] is not None
                             else interval["reason"]),
    ]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class StepRun:
    """One generation that ran a given step, from its GenerationStarted record to its end."""

    started: events_pb2.Record
    ended: events_pb2.Record | None
    first_step: int
    last_step: int | None  # None: still in force (its current step is in `status`)
    discarded_by: int | None  # a later generation that restored an older step, throwing this one's away


def runs_of_step(records: Iterable[events_pb2.Record], step: int) -> list[StepRun]:
    """Every generation in `records` that ran `step`, oldest first. A generation ran steps
    restore_step+1 ..last_step (its GenerationEnded, or the newest snapshot it committed)."""
    generations: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    for record in records:
        kind = record.event.WhichOneof("kind")
        if kind == "generation_started":
            body = record.event.generation_started
            restore = body.restore_step if body.HasField("restore_step") else 0
            generations[body.generation] = {"started": record, "ended": None, "restore": restore, "top": restore}
            order.append(body.generation)
        elif kind in ("generation_ended", "snapshot_committed"):
            body = getattr(record.event, kind)
            entry = generations.get(body.generation)
            if entry is None:
                continue
            entry["top"] = max(entry["top"], body.last_step if kind == "generation_ended" else body.step)
            if kind == "generation_ended":
                entry["ended"] = record
    runs = []
    for i, number in enumerate(order):
        entry = generations[number]
        is_ended = entry["ended"] is not None
        if not (entry["restore"] < step and (not is_ended or step <= entry["top"])):
            continue
        later = [n for n in order[i + 1:] if generations[n]["restore"] < step]
        runs.append(StepRun(entry["started"], entry["ended"], entry["restore"] + 1,
                            entry["top"] if is_ended else None, later[0] if later else None))
    return runs


def step_runs_dict(step: int, runs: list[StepRun]) -> dict[str, Any]:
    return {
        "step": step,
        "generations": [
            {
                "generation": r.started.event.generation_started.generation,
                "first_step": r.first_step,
                "last_step": r.last_step,
                "kept": r.discarded_by is None,
                "discarded_by_generation": r.discarded_by,
                "started": record_dict(r.started),
                "ended": record_dict(r.ended) if r.ended is not None else None,
            }
            for r in runs
        ],
    }


def step_runs_text(step: int, runs: list[StepRun], first_seq: int) -> str:
    if not runs:
        older = f" (records before seq {first_seq} were compacted)" if first_seq > 1 else ""
        return f"step {step}: no generation in the log ran it{older}"
    lines = [f"step {step} ran in {len(runs)} generation(s); the kept result is marked KEPT"]
    for r in runs:
        body = r.started.event.generation_started
        last = str(r.last_step) if r.last_step is not None else "(in force)"
        fate = "KEPT" if r.discarded_by is None else f"discarded: generation {r.discarded_by} restored an earlier step"
        lines.append(f"  generation {body.generation}  steps {r.first_step}..{last}  {fate}")
        lines.append(f"    seq {r.started.seq}  config_hash={body.config_hash or '-'}"
                     f"  code_version={body.code_version or '-'}  data_version={body.data_version or '-'}")
        lines.append(f"    world {body.world_size}  reason: {body.reason}")
    return "\n".join(lines)
