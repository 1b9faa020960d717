"""SDC recompute policy: when a step is replayed, on which node, and what a replay proves.

Pure. The digest vote (policies/sdc.py) compares replicas with each other, so it cannot see a
fault that reaches every replica alike: a flipped bit in one rank's local gradient before the
all-reduce, or a wrong activation, is averaged into everyone's update. A recompute replays the
step on another node from the rank's snapshot of the step before, with the same batch and RNG,
and compares per rank the local-gradient digest (and, when every rank of the world is replayed,
the parameter digest after the update) with what the ranks reported.

Rules (issue 7): a mismatch convicts nobody by itself; it is re-run on a third node, and only
two recomputes on two other nodes that agree with each other against a rank convict that rank's
node. A second recompute that agrees with the ranks convicts the first verifier instead (two
computations against one). A recompute that disagrees with *every* replayed rank names nobody:
a single fault does not corrupt every rank, a verifier that differs (software, hardware) does.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from ftsup.supervisor.core.events import SdcRankDigests


@dataclass(frozen=True, slots=True)
class RecomputeConfig:
    # Replay one step every this many steps (0: no scheduled checks). At most one scheduled
    # check is open at a time: a due step is skipped while one runs.
    every_steps: int = 0
    # A check without an answer this long after it was started (or after a new leader took
    # over) is finished as inconclusive: checks never block training for longer.
    timeout_s: float = 300.0
    # Replay every rank of the step (and the parameter update) when the world is this small and
    # purely data parallel; larger worlds replay only the checked rank's local gradient.
    full_replay_max_world: int = 16
    # A digest split (no majority to name a culprit) starts a check of the step.
    is_on_split: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.every_steps <= 10_000_000:
            raise ValueError(f"recompute every_steps must be within [0, 10000000], got {self.every_steps}")
        if not (math.isfinite(self.timeout_s) and 1.0 <= self.timeout_s <= 86_400.0):
            raise ValueError(f"recompute timeout_s must be within [1, 86400], got {self.timeout_s}")
        if not 1 <= self.full_replay_max_world <= 4096:
            raise ValueError(f"full_replay_max_world must be within [1, 4096], got {self.full_replay_max_world}")


def is_scheduled(step: int, config: RecomputeConfig) -> bool:
    """Is `step` due for a scheduled recompute?"""
    return config.every_steps > 0 and step > 0 and step % config.every_steps == 0


def scheduled_rank(step: int, world_size: int, config: RecomputeConfig) -> int:
    """The rank a scheduled check of `step` replays: round robin over the checks, so every rank's
    snapshot and local gradient are replayed in turn (step k*N checks rank k mod world)."""
    return (step // max(1, config.every_steps)) % max(1, world_size)


def replay_ranks(rank: int, world_size: int, config: RecomputeConfig, model_parallel_size: int) -> tuple[int, ...]:
    """Every rank when the whole step can be replayed from one snapshot (pure data parallel, a
    small world: every replica holds the same parameters, batches are a function of the rank),
    else `rank` alone (its local gradient only)."""
    if model_parallel_size == 1 and world_size <= config.full_replay_max_world:
        return tuple(range(world_size))
    return (rank,)


@dataclass(frozen=True, slots=True)
class VerifierCandidate:
    node_id: str
    is_member: bool  # trains in the generation in force (its cores are busy)
    failure_domain: str
    registered_order: int


def choose_verifier(candidates: Iterable[VerifierCandidate], excluded: frozenset[str], avoid_domain: str) -> str | None:
    """An idle node before a training one, outside the suspect's failure domain first, then the
    node up longest; never an excluded one (the suspect, an earlier verifier). None: nobody."""
    usable = [c for c in candidates if c.node_id not in excluded]
    if not usable:
        return None
    best = min(usable, key=lambda c: (c.is_member, bool(avoid_domain) and c.failure_domain == avoid_domain,
                                      c.registered_order, c.node_id))
    return best.node_id


@dataclass(frozen=True, slots=True)
class Comparison:
    mismatched: tuple[int, ...]  # ranks whose recompute differs from their report in anything
    culprits: tuple[int, ...]  # the ranks the difference names (empty: nobody)
    detail: str

    @property
    def is_match(self) -> bool:
        return not self.mismatched


def compare(reported: Iterable[SdcRankDigests], recomputed: Iterable[SdcRankDigests]) -> Comparison:
    """Per rank: a local-gradient mismatch names that rank (its parameters then differ on every
    rank, as the averaged gradient did: a consequence, not a culprit); with no gradient mismatch
    a parameter mismatch names the rank (a bad update). Digests missing on either side are
    "unknown, skip". Disagreeing with every replayed rank (more than one) names nobody."""
    mine = {d.rank: d for d in reported}
    theirs = {d.rank: d for d in recomputed}
    compared = sorted(set(mine) & set(theirs))
    grads = [r for r in compared if _differ(mine[r].grad_digest, theirs[r].grad_digest)]
    params = [r for r in compared if _differ(mine[r].param_digest, theirs[r].param_digest)]
    mismatched = tuple(sorted({*grads, *params}))
    if not mismatched:
        return Comparison((), (), f"{len(compared)} rank(s) recomputed bit for bit")
    culprits = tuple(grads or params)
    parts = [f"rank {r} local gradient {_short(mine[r].grad_digest)} vs recomputed {_short(theirs[r].grad_digest)}"
             for r in grads]
    if params and not grads:
        parts += [f"rank {r} parameters {_short(mine[r].param_digest)} vs recomputed {_short(theirs[r].param_digest)}"
                  for r in params]
    elif params:
        parts.append(f"parameters of {len(params)} rank(s) differ as a consequence")
    if len(culprits) == len(compared) > 1:
        parts.append(f"the recompute disagrees with all {len(compared)} ranks, which names nobody")
        culprits = ()
    return Comparison(mismatched, culprits, "; ".join(parts))


def same_recompute(a: Iterable[SdcRankDigests], b: Iterable[SdcRankDigests]) -> bool:
    """Two verifiers computed the same digests for every rank both replayed (and some rank)."""
    first = {d.rank: (d.grad_digest, d.param_digest) for d in a}
    second = {d.rank: (d.grad_digest, d.param_digest) for d in b}
    shared = set(first) & set(second)
    return bool(shared) and all(first[r] == second[r] for r in shared)


class Outcome(enum.Enum):
    MATCH = "match"  # the recompute agrees with the ranks
    UNCONFIRMED = "unconfirmed"  # a first recompute disagrees: a third node must confirm
    CONVICTED = "convicted"  # two verifiers agree against the culprit ranks
    VERIFIER_WRONG = "verifier_wrong"  # the second opinion agrees with the ranks, not the first
    INCONCLUSIVE = "inconclusive"  # the answers name nobody


@dataclass(frozen=True, slots=True)
class Judgement:
    outcome: Outcome
    comparison: Comparison
    detail: str


def judge(reported: tuple[SdcRankDigests, ...], first_recompute: tuple[SdcRankDigests, ...],
          recomputed: tuple[SdcRankDigests, ...]) -> Judgement:
    """What one check's answer proves; `first_recompute` is empty for a first check and holds
    the first verifier's answer for a confirmation."""
    comparison = compare(reported, recomputed)
    if not first_recompute:
        if comparison.is_match:
            return Judgement(Outcome.MATCH, comparison, comparison.detail)
        return Judgement(Outcome.UNCONFIRMED, comparison, comparison.detail)
    if comparison.is_match:
        first = first_recompute[0].node_id if first_recompute else "?"
        return Judgement(Outcome.VERIFIER_WRONG, comparison,
                         f"{comparison.detail}: the ranks were right, the first verifier {first} was not")
    if not same_recompute(first_recompute, recomputed):
        return Judgement(Outcome.INCONCLUSIVE, comparison,
                         f"{comparison.detail}; the two recomputes disagree with each other as well")
    if not comparison.culprits:
        return Judgement(Outcome.INCONCLUSIVE, comparison,
                         f"{comparison.detail}; both verifiers agree, but against every rank")
    return Judgement(Outcome.CONVICTED, comparison, f"{comparison.detail}; confirmed by a second verifier")


def _differ(a: str, b: str) -> bool:
    return bool(a) and bool(b) and a != b


def _short(digest: str) -> str:
    return digest[:12]
