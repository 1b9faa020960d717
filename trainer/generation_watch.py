"""Telling a rank that the agent replaced its generation, from a background thread.

Owns the watch behind `Session.on_generation_replaced`: one daemon thread per generation asks the
agent (WatchGeneration, answered when the generation is replaced) and calls the callback once,
unless the rank finished or moved on meanwhile. An agent restarting, or a call's deadline, is
asked again after a pause; a closed session ends the thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from ftsup.trainer.agent_client import AgentLinkError

WATCH_DEADLINE_S = 3600.0  # one WatchGeneration call; asked again after it
RETRY_PAUSE_S = 0.5


class Watchable(Protocol):
    def watch_generation(self, generation: int, rank: int, deadline_s: float) -> None: ...


def start(client: Watchable, generation: int, rank: int, is_current: Callable[[], bool],
          is_closed: Callable[[], bool], on_replaced: Callable[[], None]) -> threading.Thread:
    """Watches `generation` for `rank`; `is_current()` False (finished, rejoined) silences the callback."""

    def watch() -> None:
        while not is_closed() and is_current():
            try:
                client.watch_generation(generation, rank, WATCH_DEADLINE_S)
            except AgentLinkError:
                if is_closed():
                    return
                time.sleep(RETRY_PAUSE_S)  # the agent restarting, or the deadline: ask again
                continue
            if is_current():
                on_replaced()
            return

    thread = threading.Thread(target=watch, name="ftsup-generation-watch", daemon=True)
    thread.start()
    return thread
