"""The snapshot store's memory limit follows the job's snapshot sizes, capped by RAM and the flag."""

from __future__ import annotations

import hashlib

import pytest

from ftsup.agent.core.retention import KEEP_STEPS_PER_RANK
from ftsup.agent.core.snapshot_budget import BudgetBasis, snapshot_budget
from ftsup.agent.snapshots import Blob, SnapshotId, SnapshotMemoryFull, SnapshotStore

MIB = 1 << 20
RAM = 64 * 1024 * MIB
COPIES = KEEP_STEPS_PER_RANK + 2  # retention's floor + the newest KEEP steps + one arriving


def test_before_any_size_is_known_the_limit_is_half_the_ram():
    budget = snapshot_budget({}, {0, 1}, keep_per_rank=KEEP_STEPS_PER_RANK, ram_bytes=RAM)
    assert budget.basis is BudgetBasis.NO_SIZES_YET and budget.limit_bytes == RAM // 2
    assert budget.derived_bytes is None and "no snapshot size known yet" in budget.reason


def test_the_limit_is_ranks_times_their_largest_snapshot_times_the_copies_retention_keeps():
    budget = snapshot_budget({0: 100 * MIB, 1: 120 * MIB}, {0, 1, 4, 5}, keep_per_rank=KEEP_STEPS_PER_RANK,
                             ram_bytes=RAM)
    # ranks 4 and 5 (a buddy's, not seen yet) count as the largest rank seen
    assert budget.basis is BudgetBasis.DERIVED and budget.ranks == 4
    assert budget.limit_bytes == budget.derived_bytes == int((100 + 120 + 120 + 120) * MIB * COPIES * 1.25)


def test_the_derived_limit_is_capped_by_half_the_ram_and_by_the_flag():
    sizes = {rank: 4096 * MIB for rank in range(8)}
    ram_capped = snapshot_budget(sizes, range(8), keep_per_rank=KEEP_STEPS_PER_RANK, ram_bytes=RAM)
    assert ram_capped.basis is BudgetBasis.RAM_CAP and ram_capped.limit_bytes == RAM // 2
    assert ram_capped.derived_bytes is not None and ram_capped.derived_bytes > RAM // 2
    flag_capped = snapshot_budget(sizes, range(8), keep_per_rank=KEEP_STEPS_PER_RANK, ram_bytes=RAM,
                                  flag_bytes=1000 * MIB)
    assert flag_capped.basis is BudgetBasis.FLAG_CAP and flag_capped.limit_bytes == 1000 * MIB
    assert "--snapshot-memory-mib 1000" in flag_capped.reason


def test_nonsense_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match="keep_per_rank=0"):
        snapshot_budget({}, (), keep_per_rank=0, ram_bytes=RAM)


def blob(rank: int, step: int, size: int) -> Blob:
    payload = bytes([step % 256]) * size
    return Blob(1, rank, step, "n1", payload, hashlib.sha256(payload).hexdigest())


def arrive(store: SnapshotStore, rank: int, step: int, size: int):
    return store.receive(SnapshotId(1, rank, step, "n1"), size)


def test_a_store_makes_room_for_its_ranks_copies_and_refuses_beyond_them():
    store = SnapshotStore(ram_bytes=RAM)
    store.expect_ranks(frozenset({0}))
    assert store.budget.basis is BudgetBasis.NO_SIZES_YET and store.memory_limit_bytes == RAM // 2
    for step in range(1, KEEP_STEPS_PER_RANK + 1):
        store.put(blob(0, step, MIB))
    assert store.budget.basis is BudgetBasis.DERIVED
    assert store.memory_limit_bytes == int(MIB * COPIES * 1.25)  # 7.5 MiB, not half of 64 GiB
    arriving = [arrive(store, 0, step, MIB) for step in (5, 6, 7)]  # 4 held + 3 arriving fit in 7.5
    with pytest.raises(SnapshotMemoryFull, match=r"the limit of 7864320 bytes \(1 ranks x their largest"):
        arrive(store, 0, 8, MIB)
    for incoming in arriving:
        incoming.truncated()
    assert store.bytes_incoming == 0


def test_a_ranks_state_growing_after_its_first_step_grows_the_limit_with_it():
    store = SnapshotStore(ram_bytes=RAM)
    store.expect_ranks(frozenset({0, 1}))
    store.put(blob(0, 1, MIB))  # before the optimizer's moments exist
    grown = 3 * MIB
    incoming = arrive(store, 0, 2, grown)  # counted at its declared size: fits
    payload = b"\x02" * grown
    incoming.add(payload)
    incoming.finish(hashlib.sha256(payload).hexdigest())
    assert store.memory_limit_bytes == int(2 * grown * COPIES * 1.25)  # rank 1 counts as the largest too


def test_the_limit_told_to_the_agent_moves_with_the_directives_ranks():
    told = []
    store = SnapshotStore(ram_bytes=RAM, on_budget=told.append)
    store.put(blob(0, 1, MIB))
    store.expect_ranks(frozenset({0, 1, 2, 3}))
    assert [b.ranks for b in told] == [1, 4] and told[-1].limit_bytes == int(4 * MIB * COPIES * 1.25)
    store.expect_ranks(frozenset({0, 1, 2, 3}))  # the same again: nothing new to say
    assert len(told) == 2


def test_an_explicit_flag_caps_the_limit_and_bounds_what_can_ever_be_declared():
    store = SnapshotStore(memory_limit_bytes=4 * MIB, ram_bytes=RAM)
    store.put(blob(0, 1, MIB))
    assert store.budget.basis is BudgetBasis.FLAG_CAP and store.memory_limit_bytes == 4 * MIB
    assert store.cap_bytes == 4 * MIB
