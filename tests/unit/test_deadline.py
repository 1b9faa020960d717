"""`within` keeps a cancel that meets the awaited result; Python 3.11's wait_for, which it replaces
outside the tests (pyproject.toml bans it), loses it (common/deadline.py)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import pytest

from ftsup.common.deadline import within


async def _cancel_as_the_result_lands(bounded: Callable[[Awaitable[int]], Awaitable[int]]) -> str:
    """A task awaiting a bounded future is cancelled in the same loop iteration as the future's
    result lands; returns whether the task ended cancelled or ran on."""
    result: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def poller() -> str:
        await bounded(result)
        await asyncio.sleep(0.05)  # a task whose cancel was lost gets here and goes on
        return "ran on"

    task = asyncio.create_task(poller())
    await asyncio.sleep(0.01)  # the poller is waiting on the future
    result.set_result(1)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "cancelled"


async def test_a_cancel_that_meets_the_result_is_kept() -> None:
    assert await _cancel_as_the_result_lands(lambda aw: within(aw, 5)) == "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="fixed in 3.12 (gh-86296)")
async def test_the_wait_for_it_replaces_loses_that_cancel_on_311() -> None:
    assert await _cancel_as_the_result_lands(lambda aw: asyncio.wait_for(aw, 5)) == "ran on"


async def test_the_deadline_raises_timeout_and_cancels_what_it_waited_on() -> None:
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await within(never, 0.01)
    assert never.cancelled()
    assert await within(asyncio.sleep(0, result=7), None) == 7
