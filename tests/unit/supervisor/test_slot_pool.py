"""The runtime's stream-input slots (supervisor/slot_pool.py): taken in bulk, first come first
served, and never leaked by a cancellation, whenever it lands."""

from __future__ import annotations

import asyncio
import random

import pytest

from ftsup.supervisor.slot_pool import SlotPool


async def test_a_run_takes_its_slots_at_once_and_waiters_are_served_in_order():
    pool = SlotPool(4)
    await pool.take(3)
    order: list[str] = []

    async def take(name: str, count: int) -> None:
        await pool.take(count)
        order.append(name)

    big = asyncio.create_task(take("big", 3))
    await asyncio.sleep(0)
    small = asyncio.create_task(take("small", 1))  # fits now, but the bigger waiter came first
    await asyncio.sleep(0)
    assert order == [] and pool.free == 1
    pool.give(3)
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and pool.free == 0
    pool.give(4)
    assert pool.free == 4
    with pytest.raises(ValueError, match="5 slots asked of a pool of 4"):
        await pool.take(5)
    await pool.take(0)
    assert pool.free == 4


async def test_a_waiter_cancelled_before_its_grant_takes_nothing_and_lets_the_next_one_in():
    pool = SlotPool(2)
    await pool.take(2)
    first = asyncio.create_task(pool.take(2))
    await asyncio.sleep(0)
    second = asyncio.create_task(pool.take(1))
    await asyncio.sleep(0)
    pool.give(1)  # one free: the first (needing two) still waits, and holds up the second
    await asyncio.sleep(0)
    assert not second.done()
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, 1.0)  # woken by the cancelled waiter's leaving
    assert pool.free == 0
    pool.give(2)
    assert pool.free == 2


async def test_a_grant_that_meets_a_cancellation_is_given_back():
    pool = SlotPool(1)
    await pool.take(1)
    waiter = asyncio.create_task(pool.take(1))
    await asyncio.sleep(0)
    pool.give(1)  # granted to the waiter...
    waiter.cancel()  # ...which is cancelled before it runs again
    await asyncio.gather(waiter, return_exceptions=True)
    assert waiter.cancelled() and pool.free == 1, "the grant came back"


@pytest.mark.parametrize("seed", range(20))
async def test_random_takes_gives_and_cancellations_never_leak_a_slot(seed):
    rng = random.Random(seed)
    pool = SlotPool(8)
    held: list[int] = []
    tasks: list[asyncio.Task[None]] = []

    async def take(count: int) -> None:
        await pool.take(count)
        held.append(count)

    for _ in range(200):
        roll = rng.random()
        if roll < 0.45:
            tasks.append(asyncio.create_task(take(rng.randint(1, 8))))
        elif roll < 0.75 and held:
            pool.give(held.pop(rng.randrange(len(held))))
        elif tasks:
            rng.choice(tasks).cancel()
        await asyncio.sleep(0)
        assert pool.free + sum(held) <= 8
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert pool.free + sum(held) == 8, "every slot is held by a finished take or free"
