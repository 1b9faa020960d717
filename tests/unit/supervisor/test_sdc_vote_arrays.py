"""The array SDC vote (digests grouped by value with their ranks) votes exactly as the per-rank
vote it replaced (tests/support/reference_detectors.py): the same clear/diverged outcome, the same
minorities and split ranks with their digests, groups and group sizes, the same reason text, for
every replica rule (reported groups, layout, none), missing and unreported digests included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core.policies.sdc import Replicas, SdcConfig, vote_by_rank, vote_step
from tests.support.reference_detectors import ref_vote_step

digest_maps = st.dictionaries(st.integers(0, 23), st.sampled_from(["", "aaaa", "bbbb", "cccc", "aaaa", "aaaa"]),
                              min_size=1)


@st.composite
def ballots(draw):
    digests = draw(digest_maps)
    world = max(digests) + 1 - draw(st.integers(0, 2)) + draw(st.integers(0, 2))
    # reported groups: a rank's group is the lowest rank of its group (some ranks report none)
    groups = {r: draw(st.integers(0, r)) for r in digests if draw(st.booleans())} if draw(st.booleans()) else None
    config = SdcConfig(model_parallel_size=draw(st.integers(1, 4)), replicas=draw(st.sampled_from(list(Replicas))))
    return draw(st.integers(0, 50)), digests, world, config, groups


@settings(max_examples=400, deadline=None)
@given(ballots())
def test_grouped_vote_equals_the_per_rank_reference(ballot):
    step, digests, world, config, groups = ballot
    assert vote_by_rank(step, digests, world, config, groups) == ref_vote_step(step, digests, world, config, groups)


def test_one_digest_over_a_large_world_is_clear_without_walking_ranks():
    world = 100_000
    vote = vote_step(3, {"d" * 32: np.arange(world, dtype=np.int64)}, world, SdcConfig())
    assert vote.is_clear and vote.reason == "step 3: 100000 digests agree in 1 group(s)"


def test_a_flipped_rank_among_many_is_named_with_the_majority_digest():
    world = 10_000
    ranks = np.arange(world, dtype=np.int64)
    vote = vote_step(3, {"good": np.delete(ranks, 4321), "flip": np.array([4321])}, world, SdcConfig(model_parallel_size=8))
    ((rank, digest, majority, group, size),) = [(d.rank, d.digest, d.majority_digest, d.group, d.group_size)
                                               for d in vote.minorities]
    assert (rank, digest, majority, group, size) == (4321, "flip", "good", 4321 % 8, world // 8) and not vote.split
