"""SDC recompute checks in the core: when one starts, what its answer decides, when it times out,
how its events fold, and the hold an open check puts on commits.

Pure decisions over (state, soft state, input, now); what an answer proves is the policy's
(policies/recompute.py). The invariant kept here on every replica (issue 7): while a check of
step S is open, no step >= S is committed (RAM snapshot, object-store checkpoint, job
completion), so the snapshot of S - 1 stays the restore point and a conviction can always go
back to before S. Check ids are `sdc-<seq of their SdcCheckStarted record>` (`named`): unique, and
the id says where the evidence is. The checks built here are unnamed; whoever places them in the
decision (sdc_verdicts.py, through the Emission) names them after the seq they are given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ftsup.supervisor.core import frozen, taint
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.errors import InvalidEvent
from ftsup.supervisor.core.events import Event, SdcCheckFinished, SdcCheckStarted, SdcRankDigests, SdcVerdict
from ftsup.supervisor.core.inputs import SdcCheckResult
from ftsup.supervisor.core.policies import recompute
from ftsup.supervisor.core.policies.recompute import Outcome, VerifierCandidate
from ftsup.supervisor.core.state import ClusterState, Observation, SoftState, is_usable

# -- the hold -------------------------------------------------------------------------------


def hold_step(state: ClusterState) -> int | None:
    """The oldest step an open check may still prove corrupt: nothing from it on commits."""
    return min((c.step for c in state.sdc_checks), default=None)


def is_held(state: ClusterState, step: int) -> bool:
    held = hold_step(state)
    return held is not None and step >= held


def require_unheld(state: ClusterState, step: int, what: str) -> None:
    held = hold_step(state)
    if held is not None and step >= held:
        raise InvalidEvent(f"{what} at step {step}: an SDC recompute check of step {held} is open")


# -- folding -------------------------------------------------------------------------------


def evolve_check(state: ClusterState, event: SdcCheckStarted | SdcCheckFinished) -> ClusterState:
    if isinstance(event, SdcCheckStarted):
        if find(state, event.check_id) is not None:
            raise InvalidEvent(f"SDC check {event.check_id!r} is already open")
        if state.node(event.verifier_node_id) is None:
            raise InvalidEvent(f"SDC check {event.check_id!r}: verifier {event.verifier_node_id!r} is not registered")
        return frozen.replace(state, sdc_checks=(*state.sdc_checks, event))
    if find(state, event.check_id) is None:
        raise InvalidEvent(f"SDC check {event.check_id!r} is not open")
    remaining = tuple(c for c in state.sdc_checks if c.check_id != event.check_id)
    state = frozen.replace(state, sdc_checks=remaining)
    if event.tainted_from_step is not None:
        state = taint.taint_from(state, event.tainted_from_step)
    return state


def find(state: ClusterState, check_id: str) -> SdcCheckStarted | None:
    return next((c for c in state.sdc_checks if c.check_id == check_id), None)


def named(check: SdcCheckStarted, seq: int) -> SdcCheckStarted:
    """`check` named after the seq of the record it is appended as."""
    return frozen.replace(check, check_id=f"sdc-{seq}")


# -- starting ------------------------------------------------------------------------------


def on_vote(state: ClusterState, soft: SoftState, seen: Observation, config: CoreConfig) -> SdcCheckStarted | None:
    """A step's digest vote completed (`seen`, from soft.observe): a scheduled check of it, or a
    check of a split (the vote names nobody; a full replay's parameter digest can). Unnamed: see
    `named`."""
    progress = soft.progress
    generation = state.generation
    vote = seen.sdc_vote
    if vote is None or generation is None or progress is None or progress.generation != generation.number:
        return None
    if generation.world_size != config.job.world_size:
        return None  # a shrunk elastic world accumulates micro-batches: a one-batch replay would not match
    rc = config.recompute
    if vote.is_clear:
        if not recompute.is_scheduled(vote.step, rc) or state.sdc_checks:
            return None  # one scheduled check at a time: a due step is skipped while one runs
        rank = recompute.scheduled_rank(vote.step, generation.world_size, rc)
        reason = f"scheduled: every {rc.every_steps} steps"
    elif vote.split and rc.is_on_split:
        rank = min(d.rank for d in vote.split)
        reason = f"digest vote split at step {vote.step}, naming nobody"
    else:
        return None
    suspect = generation.node_of_rank(rank)
    if suspect is None:
        return None
    replayed = recompute.replay_ranks(rank, generation.world_size, rc, config.sdc.model_parallel_size)
    reported = tuple(d for d in seen.vote_reports if d.rank in replayed)
    if not any(d.rank == rank and d.grad_digest for d in reported):
        return None  # the trainer reports no local-gradient digest: unknown, skip
    holders = _holders(state, soft, rank, vote.step - 1)
    if not holders:
        return None  # no copy of the step before is known (snapshots every k steps, a fresh start): skip
    check = SdcCheckStarted(
        check_id="", step=vote.step, rank=rank, suspect_node_id=suspect, verifier_node_id="",
        generation=generation.number, reason=reason, reported=reported,
        snapshot_holders=holders, world_size=generation.world_size,
    )
    return _with_verifier(state, soft, check, frozenset({suspect}))


def _holders(state: ClusterState, soft: SoftState, rank: int, step: int) -> tuple[str, ...]:
    """Nodes known to hold `rank`'s snapshot of `step`: reported holdings of the generation in force
    (while uncommitted) and the committed snapshot's holders, the rank's buddy and node first."""
    known: set[str] = set()
    progress = soft.progress
    held = progress.holdings.get(step) if progress is not None else None
    if held is not None:
        known |= held.get(rank, frozenset())
    snapshot = state.snapshot
    if snapshot is not None and snapshot.step == step:
        known |= {h for h in snapshot.holders(rank) if h and h not in snapshot.lost_holders}
    generation = state.generation
    node = generation.node_of_rank(rank) if generation is not None else None
    member = generation.member(node) if generation is not None and node is not None else None
    first = [member.buddy_node_id, member.node_id] if member is not None else []
    return tuple(n for n in dict.fromkeys([*first, *sorted(known)]) if n in known)


def _with_verifier(state: ClusterState, soft: SoftState, check: SdcCheckStarted,
                   excluded: frozenset[str]) -> SdcCheckStarted | None:
    suspect = state.node(check.suspect_node_id)
    verifier = recompute.choose_verifier(_candidates(state, soft), excluded,
                                         suspect.failure_domain if suspect is not None else "")
    return frozen.replace(check, verifier_node_id=verifier) if verifier is not None else None


def _candidates(state: ClusterState, soft: SoftState) -> list[VerifierCandidate]:
    """Nodes that can run a replay now: alive, connected, in service."""
    generation = state.generation
    out = []
    for node in state.nodes.values():
        if is_usable(node, soft):
            is_member = generation is not None and generation.member(node.node_id) is not None
            out.append(VerifierCandidate(node.node_id, is_member, node.failure_domain, node.registered_order))
    return out


# -- answers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckVerdict:
    """What one answer decided: the SdcCheckFinished record (None: the check is not open), maybe a
    second opinion (unnamed: see `named`) appended right after it, and the nodes it convicts, whose
    quarantines name the finished record as evidence."""

    finished: SdcCheckFinished | None
    second_opinion: SdcCheckStarted | None = None
    convicted: tuple[str, ...] = ()
    reason: str = ""


def on_result(state: ClusterState, soft: SoftState, result: SdcCheckResult) -> CheckVerdict:
    """Judges a verifier's answer (admission made sure the check is open and the sender is its verifier)."""
    check = find(state, result.check_id)
    if check is None:
        return CheckVerdict(None)
    mine = _own_digest(check.reported, check.rank)
    theirs = _own_digest(result.recomputed, check.rank)

    def finished(verdict: SdcVerdict, detail: str, culprits: tuple[str, ...] = (),
                 tainted: int | None = None) -> SdcCheckFinished:
        return SdcCheckFinished(check.check_id, verdict, mine, theirs, result.recomputed, culprits,
                                f"step {check.step}: {detail}", tainted)

    if result.error:
        detail = f"{check.verifier_node_id} could not recompute: {result.error}"
        return CheckVerdict(finished(SdcVerdict.INCONCLUSIVE, detail))
    judgement = recompute.judge(check.reported, check.first_recompute, result.recomputed)
    culprits = _nodes_of(check.reported, judgement.comparison.culprits)
    match judgement.outcome:
        case Outcome.MATCH:
            return CheckVerdict(finished(SdcVerdict.MATCH, judgement.detail))
        case Outcome.INCONCLUSIVE:
            return CheckVerdict(finished(SdcVerdict.INCONCLUSIVE, judgement.detail))
        case Outcome.UNCONFIRMED:
            return _second_opinion(state, soft, check, result, finished, judgement.detail, culprits)
        case Outcome.VERIFIER_WRONG:
            first = check.first_recompute[0].node_id
            done = finished(SdcVerdict.MATCH, judgement.detail, (first,))
            reason = f"SDC: verifier {first} recomputed step {check.step} wrongly ({check.check_id}): {judgement.detail}"
            return CheckVerdict(done, None, (first,), reason)
        case Outcome.CONVICTED:
            # Only the generation that computed the step still carries it: a later one restored
            # from before it (the hold kept anything newer from being committed meanwhile).
            current = state.generation
            tainted = check.step if current is not None and current.number == check.generation else None
            done = finished(SdcVerdict.MISMATCH, judgement.detail, culprits, tainted)
            reason = f"SDC: recompute of step {check.step} ({check.confirms_check_id}, {check.check_id}): {judgement.detail}"
            return CheckVerdict(done, None, culprits, reason)
    raise AssertionError(judgement.outcome)


def _second_opinion(state: ClusterState, soft: SoftState, check: SdcCheckStarted, result: SdcCheckResult,
                    finished: Callable[..., SdcCheckFinished], detail: str, culprits: tuple[str, ...]) -> CheckVerdict:
    """A first mismatch convicts nobody: the same replay goes to a third node, neither the
    verifier nor a named culprit."""
    suspect = culprits[0] if culprits else check.suspect_node_id
    second = SdcCheckStarted(
        check_id="", step=check.step, rank=check.rank, suspect_node_id=suspect,
        verifier_node_id="", generation=check.generation, reason=f"second opinion on {check.check_id}",
        confirms_check_id=check.check_id, reported=check.reported, first_recompute=result.recomputed,
        snapshot_holders=check.snapshot_holders, world_size=check.world_size,
    )
    excluded = frozenset({check.verifier_node_id, check.suspect_node_id, *culprits})
    started = _with_verifier(state, soft, second, excluded)
    if started is None:
        return CheckVerdict(finished(SdcVerdict.MISMATCH, f"{detail}; no third node is free to confirm it: nothing done"))
    asking = finished(SdcVerdict.MISMATCH, f"{detail}; asking {started.verifier_node_id} for a second opinion")
    return CheckVerdict(asking, started)


def on_tick(state: ClusterState, soft: SoftState, now: float, config: CoreConfig) -> list[Event]:
    """Checks without an answer within the timeout finish inconclusive: they never hold commits
    (or the job's completion) longer than that."""
    limit = config.recompute.timeout_s
    out: list[Event] = []
    for check in state.sdc_checks:
        seen = soft.sdc_check_seen_s.get(check.check_id)
        if seen is None or now - seen < limit:
            continue
        detail = f"step {check.step}: no answer from {check.verifier_node_id} within {limit:g}s"
        out.append(SdcCheckFinished(check.check_id, SdcVerdict.INCONCLUSIVE, _own_digest(check.reported, check.rank),
                                    "", (), (), detail))
    return out


def _own_digest(digests: tuple[SdcRankDigests, ...], rank: int) -> str:
    return next((d.grad_digest for d in digests if d.rank == rank), "")


def _nodes_of(reported: tuple[SdcRankDigests, ...], ranks: tuple[int, ...]) -> tuple[str, ...]:
    return tuple(sorted({d.node_id for d in reported if d.rank in ranks and d.node_id}))
