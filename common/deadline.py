"""`within(awaitable, seconds)`: a deadline on one await that never swallows a cancel.

Python 3.11's `asyncio.wait_for` loses a cancellation that arrives in the same loop iteration as
the awaited result: it returns the result and the task runs on as if nothing had been asked of it
(fixed in 3.12, gh-86296; shown by tests/unit/test_deadline.py). A loop that polls with
it (the follower's leader lookup, every 0.5 s) then outlives the `cancel()` meant to stop it, and
whoever awaits that task waits forever: a newly elected replica that could not stop following
(supervisor/replica.py's takeover watchdog ended such a process after 60 s, seen in CI).
`asyncio.timeout` counts cancellations per task and re-raises one that came from outside, so the
deadline is built on it. ruff bans `asyncio.wait_for` outside the tests (pyproject.toml, TID251).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """Awaits `awaitable` for at most `timeout_s` seconds (None: no limit). Raises TimeoutError
    at the deadline (the awaitable is cancelled, as with wait_for); a cancel of the caller is
    always re-raised, even when the result arrived in the same iteration."""
    async with asyncio.timeout(timeout_s):
        return await awaitable
