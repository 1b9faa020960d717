"""The grants and restores directives read of a generation are worked out once per generation
(`directives._plan`, kept on the Generation): what they give equals working them out afresh from
the state, for random generations and open SDC checks, and a copy of a generation with other
members or restores (`frozen.replace` shares the cache's slot) is never served the original's.
Pure: milliseconds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core import frozen
from ftsup.supervisor.core.directives import PeerGrant, peer_grants
from ftsup.supervisor.core.events import RankAssignment, RankRestore, RestoreKind, SdcCheckStarted
from ftsup.supervisor.core.state import ClusterState, Generation

NODES = [f"n{i}" for i in range(6)]


def _afresh(state: ClusterState) -> dict[str, tuple[PeerGrant, ...]]:
    """The grants as the rules state them, with nothing kept: buddies store their members' ranks,
    a peer restore's source serves the restored rank (its `source_rank` when set) to the restorer,
    an SDC check's snapshot holders serve its rank to the verifier."""
    stores: dict[str, dict[str, set[int]]] = {}
    fetches: dict[str, dict[str, set[int]]] = {}
    generation = state.generation
    if generation is not None:
        owner = {rank: m.node_id for m in reversed(generation.members) for rank in m.ranks}
        for member in generation.members:
            if member.buddy_node_id and member.buddy_node_id != member.node_id:
                stores.setdefault(member.buddy_node_id, {}).setdefault(member.node_id, set()).update(member.ranks)
        for restore in generation.restores:
            restorer = owner.get(restore.rank)
            if restore.kind is RestoreKind.PEER_SNAPSHOT and restorer and restorer != restore.source_node_id:
                rank = restore.rank if restore.source_rank is None else restore.source_rank
                fetches.setdefault(restore.source_node_id, {}).setdefault(restorer, set()).add(rank)
    for check in state.sdc_checks:
        for holder in check.snapshot_holders:
            if holder != check.verifier_node_id:
                fetches.setdefault(holder, {}).setdefault(check.verifier_node_id, set()).add(check.rank)
    return {
        node: tuple(PeerGrant(other, tuple(sorted(stores.get(node, {}).get(other, ()))),
                              tuple(sorted(fetches.get(node, {}).get(other, ()))))
                    for other in sorted({*stores.get(node, {}), *fetches.get(node, {})}))
        for node in {*stores, *fetches}
    }


@st.composite
def generations(draw: st.DrawFn) -> Generation:
    holders = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=5, unique=True))
    per_node = draw(st.integers(1, 3))
    members = tuple(RankAssignment(node, tuple(range(i * per_node, (i + 1) * per_node)),
                                   draw(st.sampled_from(["", *NODES])))
                    for i, node in enumerate(holders))
    world = len(holders) * per_node
    restores = tuple(
        RankRestore(rank, draw(st.sampled_from(RestoreKind)), draw(st.sampled_from(["", *NODES])),
                    draw(st.none() | st.integers(0, world - 1)))
        for rank in draw(st.lists(st.integers(0, world - 1), max_size=world, unique=True))
    )
    return Generation(draw(st.integers(1, 9)), members, world, "10.0.0.1", 29500, None, 0, restores)


checks = st.lists(st.builds(SdcCheckStarted, st.text(max_size=3), st.integers(1, 9), st.integers(0, 8),
                            st.sampled_from(NODES), st.sampled_from(NODES),
                            snapshot_holders=st.lists(st.sampled_from(NODES), max_size=3).map(tuple)),
                  max_size=3).map(tuple)


@settings(max_examples=150, deadline=None)
@given(generations(), checks, generations())
def test_the_kept_plan_gives_what_working_it_out_afresh_gives(generation, sdc_checks, other):
    state = ClusterState(generation=generation, sdc_checks=sdc_checks)
    assert dict(peer_grants(state)) == _afresh(state)
    assert dict(peer_grants(state)) == _afresh(state)  # (served from the plan now)
    # A copy with another generation's members and restores shares the slot the plan is kept in:
    # it must get its own grants, and the original its own again after it.
    copy = frozen.replace(generation, members=other.members, restores=other.restores, world_size=other.world_size)
    restores_only = frozen.replace(generation, restores=tuple(
        RankRestore(r.rank, RestoreKind.PEER_SNAPSHOT, "n5", r.source_rank) for r in generation.restores))
    assert copy._directing is generation._directing is restores_only._directing
    for checked in (copy, generation, copy, restores_only, generation):
        changed = ClusterState(generation=checked, sdc_checks=sdc_checks)
        assert dict(peer_grants(changed)) == _afresh(changed)


def test_open_checks_do_not_change_the_plan_kept_for_later_pushes():
    generation = Generation(1, (RankAssignment("n0", (0,), "n1"), RankAssignment("n1", (1,), "n0")), 2,
                            "10.0.0.1", 29500, None, 0, ())
    check = SdcCheckStarted("c", 3, 0, "n0", "n2", snapshot_holders=("n0", "n1"))
    with_check = peer_grants(ClusterState(generation=generation, sdc_checks=(check,)))
    assert with_check["n1"] == (PeerGrant("n0", (0,), ()), PeerGrant("n2", (), (0,)))
    assert peer_grants(ClusterState(generation=generation))["n1"] == (PeerGrant("n0", (0,), ()),)
    # Another check later: the first one's fetch is not remembered.
    other = SdcCheckStarted("d", 4, 1, "n1", "n3", snapshot_holders=("n1",))
    assert peer_grants(ClusterState(generation=generation, sdc_checks=(other,)))["n1"] == (
        PeerGrant("n0", (0,), ()), PeerGrant("n3", (), (1,)))
