"""Waiting on a condition inside an async test: polled with a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        await asyncio.sleep(0.02)
