"""The SDC digest vote: majorities name the culprit, splits name nobody, shards vote apart."""

from __future__ import annotations

import pytest

from ftsup.supervisor.core.policies.sdc import SdcConfig, is_convicting, vote_by_rank

DP = SdcConfig()


def test_identical_digests_make_the_step_clear():
    vote = vote_by_rank(7, {0: "a", 1: "a", 2: "a", 3: "a"}, 4, DP)
    assert vote.is_clear and not vote.is_diverged
    assert "4 digests agree in 1 group" in vote.reason


def test_a_minority_digest_is_named_with_the_majority_as_evidence():
    vote = vote_by_rank(7, {0: "a", 1: "a", 2: "flipped", 3: "a"}, 4, DP)
    assert not vote.is_clear and vote.split == ()
    (minority,) = vote.minorities
    assert (minority.rank, minority.digest, minority.majority_digest, minority.group_size) == (2, "flipped", "a", 4)
    assert is_convicting(minority, DP)
    assert "rank 2 flipped vs majority a" in vote.reason


def test_an_even_split_names_no_culprit():
    vote = vote_by_rank(9, {0: "a", 1: "b", 2: "b", 3: "a"}, 4, DP)
    assert vote.minorities == () and not vote.is_clear
    assert [(d.rank, d.majority_digest) for d in vote.split] == [(0, ""), (1, ""), (2, ""), (3, "")]
    assert not any(is_convicting(d, DP) for d in vote.split)
    assert "group 0 split [2, 2]" in vote.reason


def test_two_replicas_can_only_split():
    vote = vote_by_rank(1, {0: "a", 1: "b"}, 2, DP)
    assert vote.minorities == () and len(vote.split) == 2


def test_a_step_is_not_voted_until_every_rank_reported():
    vote = vote_by_rank(3, {0: "a", 2: "b"}, 4, DP)
    assert not vote.is_clear and not vote.is_diverged
    assert "waiting for ranks [1, 3]" in vote.reason


def test_ranks_without_a_digest_are_unknown_not_votes():
    vote = vote_by_rank(3, {0: "a", 1: "", 2: "a", 3: ""}, 4, DP)
    assert vote.is_clear


def test_with_model_parallelism_only_ranks_holding_the_same_shard_are_compared():
    tp2 = SdcConfig(model_parallel_size=2)
    # Ranks 0, 2, 4 hold shard 0; ranks 1, 3, 5 hold shard 1: different bits, no disagreement.
    assert vote_by_rank(5, {0: "s0", 1: "s1", 2: "s0", 3: "s1", 4: "s0", 5: "s1"}, 6, tp2).is_clear
    vote = vote_by_rank(5, {0: "s0", 1: "s1", 2: "s0", 3: "bad", 4: "s0", 5: "s1"}, 6, tp2)
    (minority,) = vote.minorities
    assert (minority.rank, minority.majority_digest, minority.group, minority.group_size) == (3, "s1", 1, 3)


def test_a_larger_conviction_quorum_leaves_small_groups_as_suspects_only():
    strict = SdcConfig(min_group_to_convict=5)
    (minority,) = vote_by_rank(1, {0: "a", 1: "a", 2: "b", 3: "a"}, 4, strict).minorities
    assert not is_convicting(minority, strict)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model_parallel_size": 0}, "model_parallel_size must be within [1, 65536], got 0"),
    ({"min_group_to_convict": 2}, "min_group_to_convict must be within [3, 65536], got 2"),
])
def test_bad_config_is_rejected_naming_the_value(kwargs, message):
    with pytest.raises(ValueError) as err:
        SdcConfig(**kwargs)
    assert message in str(err.value)
