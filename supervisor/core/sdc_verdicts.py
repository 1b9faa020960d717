"""What SDC evidence decides in the core: a step's digest vote, a recompute check's answer, and
a check closing (answered or timed out).

A minority digest quarantines its node with its SdcSuspected record as evidence and restarts the
job from the last agreed snapshot (always before the divergent step: snapshot_commits.py never
commits a step whose digests disagreed); a split restarts it with nobody quarantined, and may
start a recompute check to name the side that computed wrongly. A check's confirmed mismatch
quarantines the culprit with the SdcCheckFinished record as evidence. The checks' own mechanics
(when one starts, what an answer proves, the hold on commits) are sdc_checks.py's; the vote is
soft.py's and policies/sdc.py's. Pure.
"""

from __future__ import annotations

from ftsup.supervisor.core import sdc_checks
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.emission import Emission
from ftsup.supervisor.core.events import (
    EndReason,
    Event,
    NodeQuarantined,
    QuarantineCause,
    SdcCheckStarted,
    SdcSuspected,
)
from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.generations import complete_if_finished, end_current, end_if_member
from ftsup.supervisor.core.inputs import SdcCheckResult
from ftsup.supervisor.core.policies import sdc as sdc_policy
from ftsup.supervisor.core.snapshot_commits import commit_if_held, commit_newest_held
from ftsup.supervisor.core.state import ClusterState, Observation, SoftState


def on_vote(state: ClusterState, soft: SoftState, seen: Observation, config: CoreConfig, out: Emission) -> None:
    """A completed digest vote: agreed -> the step may commit; a minority -> SdcSuspected with the
    digests, the culprit's node quarantined and the job restarted from the last agreed snapshot;
    a split -> restart, culprit unknown. `state`: the decision so far folded in."""
    progress = soft.progress
    generation = state.generation
    vote = seen.sdc_vote
    if vote is None or generation is None or progress is None or progress.generation != generation.number:
        return
    if vote.is_clear:
        # A scheduled recompute of the step opens first: it holds the step's commit back.
        _open(out, sdc_checks.on_vote(state, soft, seen, config))
        out.extend(commit_if_held(out.folded(), soft, vote.step))
        return
    evidence: dict[str, int] = {}  # a convicted node -> the seq of its first SdcSuspected record
    for dissent in (*vote.minorities, *vote.split):
        node_id = generation.node_of_rank(dissent.rank)
        if node_id is None:
            continue
        seq = out.add(SdcSuspected(node_id, dissent.rank, vote.step, dissent.digest, dissent.majority_digest,
                                   generation.number, dissent.group_size))
        if sdc_policy.is_convicting(dissent, config.sdc):
            evidence.setdefault(node_id, seq)
    if not evidence:
        # A split: a recompute of the step (on a node outside the job when one is free) can name
        # the side that computed wrongly; the job restarts meanwhile, nobody is quarantined yet.
        _open(out, sdc_checks.on_vote(out.folded(), soft, seen, config))
        detail = f"SDC: {vote.reason}; no majority names a culprit, restarting from the last agreed step"
        out.extend(end_current(state, soft, EndReason.SDC, detail))
        return
    culprits = sorted(evidence)
    reason = f"SDC: {vote.reason}"
    out.extend(end_if_member(state, soft, culprits[0], EndReason.NODE_QUARANTINED, reason))
    for node_id in culprits:
        if not state.nodes[node_id].is_quarantined:
            out.add(NodeQuarantined(node_id, reason, evidence[node_id], QuarantineCause.SDC))


def on_check_result(state: ClusterState, soft: SoftState, result: SdcCheckResult, out: Emission) -> None:
    """A verifier answered: the check finishes (maybe a second opinion starts); a confirmed
    mismatch quarantines the culprit's node with the finished record as evidence, and a verdict
    that taints the step ends its generation so the job restores from before it. A clean step
    (also one whose first verifier is convicted) commits what the check held back first."""
    verdict = sdc_checks.on_result(state, soft, result)
    evidence = out.add(verdict.finished) if verdict.finished is not None else 0
    _open(out, verdict.second_opinion)
    folded = out.folded()
    is_tainted = folded.sdc_tainted_from_step is not None and folded.generation is not None
    if not is_tainted:
        out.extend(after_checks_closed(folded, soft))
    for node_id in verdict.convicted:
        folded = out.folded()
        out.extend(end_if_member(folded, soft, node_id, EndReason.NODE_QUARANTINED, verdict.reason))
        if not folded.nodes[node_id].is_quarantined:
            out.add(NodeQuarantined(node_id, verdict.reason, evidence, QuarantineCause.SDC))
    folded = out.folded()
    if is_tainted and folded.generation is not None:
        # Tainted while training on: the generation holds corrupt state whoever computed it.
        out.extend(end_current(folded, soft, EndReason.SDC, verdict.reason or "SDC: tainted by a recompute"))


def on_tick(state: ClusterState, soft: SoftState, now: float, config: CoreConfig, out: Emission) -> None:
    """Checks without an answer within the timeout finish inconclusive, and what they held back
    (a commit, the job's completion) goes ahead."""
    timed_out = sdc_checks.on_tick(state, soft, now, config)
    if timed_out:
        out.extend(timed_out)
        out.extend(after_checks_closed(out.folded(), soft))


def after_checks_closed(state: ClusterState, soft: SoftState) -> list[Event]:
    """Checks closed: the newest step no longer held back commits, and a job whose ranks all
    finished completes once no check is open."""
    committed = commit_newest_held(state, soft)
    return committed + complete_if_finished(evolve_all(state, committed), soft)


def _open(out: Emission, check: SdcCheckStarted | None) -> None:
    """Appends a recompute check, named after the seq of its record (sdc_checks.named)."""
    if check is not None:
        out.add_numbered(lambda seq: sdc_checks.named(check, seq))
