"""Fault verdicts that swap a node out: an Xid, a hung rank, a confirmed straggler.

Each records what was seen (XidReported, the hang's GenerationEnded, StragglerDetected), ends the
generation when the node trains in it, and quarantines the node naming that record as its
evidence (`NodeQuarantined.evidence_seq`, handed out by the decision's Emission as the record is
added). What each verdict means is its policy's (policies/xid.py, the straggler scores observed
in soft.py); this module turns verdicts into events. Pure.
"""

from __future__ import annotations

from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.emission import Emission
from ftsup.supervisor.core.events import (
    EndReason,
    NodeQuarantined,
    QuarantineCause,
    StragglerDetected,
    XidAction,
    XidReported,
)
from ftsup.supervisor.core.generations import end_if_member, ended
from ftsup.supervisor.core.inputs import TrainerHung, XidReport
from ftsup.supervisor.core.policies import xid as xid_policy
from ftsup.supervisor.core.state import ClusterState, Observation, SoftState, is_usable


def on_xid(state: ClusterState, soft: SoftState, report: XidReport, now: float, config: CoreConfig,
           out: Emission) -> None:
    """Recorded always; a job restart, or (a GPU that needs a reset, a node that needs a person)
    its ranks go elsewhere and the node is quarantined with the XidReported record as evidence."""
    history = soft.xids.get(report.node_id, [])
    verdict = xid_policy.judge_xid(history[:-1], report, now, config.xid)  # the last entry is this one
    evidence = out.add(XidReported(report.node_id, report.pci, report.gpu, report.code, verdict.action,
                                   report.message, verdict.is_unknown))
    if verdict.action is XidAction.IGNORE:
        return
    if verdict.action is XidAction.RESTART_JOB:
        out.extend(end_if_member(state, soft, report.node_id, EndReason.XID, verdict.reason))
        return
    out.extend(end_if_member(state, soft, report.node_id, EndReason.NODE_QUARANTINED, verdict.reason))
    if not state.nodes[report.node_id].is_quarantined:
        out.add(NodeQuarantined(report.node_id, verdict.reason, evidence, QuarantineCause.XID))


def on_hung(state: ClusterState, soft: SoftState, hung: TrainerHung, out: Emission) -> None:
    """A hung rank ends the generation. Its node is swapped for a free spare only when the rank is
    the culprit: behind a step the others completed. In a synchronous job one frozen rank stalls
    every rank in the next collective at the same last step, and whichever agent's watcher fires
    first reports; blaming it would swap a healthy node. Then the same gang restarts (from the
    snapshot), which replaces the frozen process wherever it is. The quarantine's evidence is the
    hang's GenerationEnded record."""
    progress = soft.progress
    newest = progress.max_step if progress is not None and progress.generation == hung.generation else hung.last_step
    is_culprit = hung.last_step < newest
    detail = (f"rank {hung.rank} made no step progress for {hung.silent_for_s:.0f}s"
              f" (limit {hung.limit_s:.0f}s) after step {hung.last_step}")
    if not is_culprit:
        detail += f"; every rank stopped at step {newest}, so the culprit is unknown: restarting the same gang"
    generation = state.generation
    if generation is None or not generation.member(hung.node_id):
        return
    evidence = out.add(ended(soft, generation.number, EndReason.HUNG, hung.node_id, detail,
                             silent_for_s=hung.silent_for_s))
    if is_culprit and has_free_spare(state, soft) and not state.nodes[hung.node_id].is_quarantined:
        out.add(NodeQuarantined(hung.node_id, f"hung: {detail}", evidence, QuarantineCause.HUNG))


def on_stragglers(state: ClusterState, soft: SoftState, seen: Observation, config: CoreConfig,
                  out: Emission) -> None:
    """Confirmed stragglers (from the step just scored): recorded; the first one is swapped out
    when a spare is free (one swap ends the generation; others wait for the next), with its
    StragglerDetected record as evidence."""
    progress = soft.progress
    generation = state.generation
    if progress is None or generation is None or not seen.straggler_verdicts:
        return
    is_swapped = False
    for verdict in seen.straggler_verdicts:
        node_id = generation.node_of_rank(verdict.rank)
        if not verdict.is_straggler or node_id is None:
            continue
        window = f"steps {verdict.window[0]}..{verdict.window[1]}"
        evidence = out.add(StragglerDetected(node_id, verdict.rank, verdict.scores[-1], len(verdict.scores),
                                             verdict.over_threshold, f"{verdict.reason}; {window}"))
        if config.is_straggler_swap_enabled and not is_swapped and has_free_spare(state, soft):
            reason = f"rank {verdict.rank} {verdict.reason}"
            out.extend(end_if_member(state, soft, node_id, EndReason.NODE_QUARANTINED, reason))
            out.add(NodeQuarantined(node_id, reason, evidence, QuarantineCause.STRAGGLER))
            is_swapped = True


def has_free_spare(state: ClusterState, soft: SoftState) -> bool:
    """A usable node outside the generation in force could take a swapped node's ranks."""
    generation = state.generation
    for node in state.nodes.values():
        if is_usable(node, soft) and (generation is None or generation.member(node.node_id) is None):
            return True
    return False
