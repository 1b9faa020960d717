"""`supervisorctl sdc`: the silent-data-corruption record, derived from the event log.

Pure (records in, a dict or text out). No RPC of its own: the log already holds every SDC fact
(SdcSuspected with the digests, SdcCheckStarted/Finished, the quarantines and restarts they
caused), so the view is computed client-side from ListEvents and cannot drift from the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ftsup.v1 import events_pb2

# Records written before quarantine causes existed carry no cause; their reasons began with this
# (decide.py's wording then). Read only for such records: a cause, when present, decides.
LEGACY_SDC_PREFIX = "SDC:"


def _is_sdc_quarantine(body: events_pb2.NodeQuarantined) -> bool:
    if body.cause != events_pb2.QUARANTINE_CAUSE_UNSPECIFIED:
        return body.cause == events_pb2.QUARANTINE_CAUSE_SDC
    return body.reason.startswith(LEGACY_SDC_PREFIX)


def sdc_dict(records: Iterable[events_pb2.Record]) -> dict[str, Any]:
    suspects: list[dict[str, Any]] = []
    checks: dict[str, dict[str, Any]] = {}
    verdicts: list[dict[str, Any]] = []
    for record in records:
        event = record.event
        kind = event.WhichOneof("kind")
        if kind == "sdc_suspected":
            suspects.append(_suspect(record.seq, event.sdc_suspected))
        elif kind == "sdc_check_started":
            checks[event.sdc_check_started.check_id] = _started_check(record.seq, event.sdc_check_started)
        elif kind == "sdc_check_finished" and event.sdc_check_finished.check_id in checks:
            _finish_check(checks[event.sdc_check_finished.check_id], record.seq, event.sdc_check_finished)
        elif kind == "node_quarantined" and _is_sdc_quarantine(event.node_quarantined):
            body = event.node_quarantined
            verdicts.append({"seq": record.seq, "action": "quarantined", "node_id": body.node_id,
                             "evidence_seq": body.evidence_seq, "reason": body.reason})
        elif kind == "generation_ended" and event.generation_ended.reason == events_pb2.END_REASON_SDC:
            ended = event.generation_ended
            verdicts.append({"seq": record.seq, "action": "restarted", "node_id": "",
                             "evidence_seq": 0, "reason": ended.detail, "last_step": ended.last_step})
    return {"checks": list(checks.values()), "suspects": suspects, "verdicts": verdicts}


def _suspect(seq: int, body: events_pb2.SdcSuspected) -> dict[str, Any]:
    return {
        "seq": seq, "generation": body.generation, "step": body.step, "node_id": body.node_id,
        "rank": body.rank, "digest": body.digest, "majority_digest": body.majority_digest,
        "group_size": body.group_size, "vote": "minority" if body.majority_digest else "split",
    }


def _started_check(seq: int, body: events_pb2.SdcCheckStarted) -> dict[str, Any]:
    """A check as it starts: running, every replayed rank's report without a recompute yet."""
    return {
        "check_id": body.check_id, "seq": seq, "step": body.step, "rank": body.rank,
        "suspect_node_id": body.suspect_node_id, "verifier_node_id": body.verifier_node_id,
        "verdict": "running", "reported_digest": "", "recomputed_digest": "",
        "generation": body.generation, "reason": body.reason, "confirms_check_id": body.confirms_check_id,
        "finished_seq": 0, "culprit_node_ids": [], "detail": "", "tainted_from_step": None,
        "ranks": [_reported_rank(d) for d in body.reported],
    }


def _finish_check(check: dict[str, Any], seq: int, body: events_pb2.SdcCheckFinished) -> None:
    """Puts the verdict and each rank's recompute into the started `check`."""
    verdict = events_pb2.SdcVerdict.Name(body.verdict).removeprefix("SDC_VERDICT_").lower()
    recomputed = {d.rank: d for d in body.recomputed}
    check.update(verdict=verdict, reported_digest=body.reported_digest,
                 recomputed_digest=body.recomputed_digest, finished_seq=seq,
                 culprit_node_ids=list(body.culprit_node_ids), detail=body.detail,
                 tainted_from_step=body.tainted_from_step if body.HasField("tainted_from_step") else None,
                 ranks=[_with_recompute(r, recomputed.get(r["rank"])) for r in check["ranks"]])


def _reported_rank(reported: events_pb2.SdcRankDigests) -> dict[str, Any]:
    """One replayed rank's evidence as the check started: what it reported, nothing recomputed."""
    return {"rank": reported.rank, "node_id": reported.node_id, "reported_grad_digest": reported.grad_digest,
            "reported_param_digest": reported.param_digest, "recomputed_grad_digest": "",
            "recomputed_param_digest": "", "matches": None}


def _with_recompute(reported: dict[str, Any], recomputed: events_pb2.SdcRankDigests | None) -> dict[str, Any]:
    """A started check's rank row, now with what the verifier recomputed (a copy; None: not replayed)."""
    row = dict(reported)
    if recomputed is not None:
        row.update(recomputed_grad_digest=recomputed.grad_digest, recomputed_param_digest=recomputed.param_digest)
        row["matches"] = all(not (a and b) or a == b for a, b in (
            (row["reported_grad_digest"], recomputed.grad_digest), (row["reported_param_digest"], recomputed.param_digest)))
    return row


def sdc_text(view: dict[str, Any]) -> str:
    lines = [f"checks    {len(view['checks'])} recompute check(s)"]
    for c in view["checks"]:
        why = f"second opinion on {c['confirms_check_id']}" if c["confirms_check_id"] else c["reason"]
        outcome = c["verdict"] + (f" (#{c['finished_seq']})" if c["finished_seq"] else "")
        if c["culprit_node_ids"]:
            outcome += f", convicts {', '.join(c['culprit_node_ids'])}"
        if c["tainted_from_step"] is not None:
            outcome += f", taints steps from {c['tainted_from_step']}"
        lines.append(f"  #{c['seq']:<6} {c['check_id']} gen {c['generation']} step {c['step']} rank {c['rank']} of"
                     f" {c['suspect_node_id']} replayed on {c['verifier_node_id']}{f' ({why})' if why else ''}: {outcome}")
        for r in c["ranks"]:
            if r["matches"] is False:
                lines.append(f"           rank {r['rank']} on {r['node_id']}: reported gradient {r['reported_grad_digest']}"
                             f" parameters {r['reported_param_digest']}, recomputed {r['recomputed_grad_digest']}"
                             f" {r['recomputed_param_digest']}")
        if c["detail"]:
            lines.append(f"           {c['detail']}")
    lines.append(f"suspects  {len(view['suspects'])}")
    for s in view["suspects"]:
        against = f"majority {s['majority_digest']}" if s["majority_digest"] else f"no majority in {s['group_size']}"
        lines.append(f"  #{s['seq']:<6} gen {s['generation']} step {s['step']} {s['node_id']} rank {s['rank']}"
                     f" ({s['vote']}): digest {s['digest']} vs {against}")
    lines.append(f"verdicts  {len(view['verdicts'])}")
    for v in view["verdicts"]:
        evidence = f" (evidence #{v['evidence_seq']})" if v["evidence_seq"] else ""
        lines.append(f"  #{v['seq']:<6} {v['action']} {v['node_id'] or 'the job'}{evidence}: {v['reason']}")
    return "\n".join(lines)
