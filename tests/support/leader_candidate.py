"""A supervisor-like candidate in its own process, for tests that SIGSTOP a leader.

`python -m tests.support.leader_candidate ENDPOINTS PREFIX ADDRESS`: campaigns until it leads,
prints `LEADER <term>`, appends one fenced record; then, for each line `append` on stdin, tries a
fenced append at its term and prints APPENDED, FENCED or UNAVAILABLE. Prints `LOST` when its own
keepalive decides leadership is gone.
"""

from __future__ import annotations

import asyncio
import sys
import time

from ftsup.supervisor.core.events import NodeCleared
from ftsup.supervisor.eventlog.api import Fenced, LogUnavailable
from ftsup.supervisor.eventlog.etcd import EtcdLog, make_client
from ftsup.supervisor.leader import LeaderElection


def say(line: str) -> None:
    print(line, flush=True)


async def main(endpoints: str, prefix: str, address: str) -> None:
    client = make_client(endpoints.split(","))
    election = LeaderElection(client, prefix, address, on_lost=lambda _: say("LOST"))
    leader = await election.run_until_leader()
    log = await EtcdLog.open(client, prefix, fence_key=election.key)
    await log.append([NodeCleared(address, "won")], term=leader.term, time_unix_s=time.time())
    say(f"LEADER {leader.term}")
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "append":
        try:
            await log.append([NodeCleared(address, "late")], term=leader.term, time_unix_s=time.time())
            say("APPENDED")
        except Fenced:
            say("FENCED")
        except LogUnavailable:
            say("UNAVAILABLE")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
