"""A process that appends to an EmbeddedLog under load and prints what was acknowledged.

`python -m tests.support.log_writer DIR [--fsize-limit BYTES]`: 8 concurrent appenders write
batches of 1-12 events; after each acknowledged append one line goes to stdout:
`ACK <first_seq> <last_seq> <task> <batch>`. Each event names its task and batch, so a reader can
check that every acknowledged record is there with exactly its content. With --fsize-limit the
process may not grow any file past that size (RLIMIT_FSIZE): a real "disk full" for the writer.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import random
import resource
import signal
import sys

from ftsup.supervisor.core.events import NodeCleared
from ftsup.supervisor.eventlog.api import LogUnavailable
from ftsup.supervisor.eventlog.embedded import EmbeddedLog


def event(task: int, batch: int, index: int) -> NodeCleared:
    return NodeCleared(f"t{task}", f"b{batch}.{index} " + "x" * (index * 7 % 50))


async def appender(log: EmbeddedLog, task: int, rng: random.Random, limit: int | None) -> None:
    batch = 0
    while limit is None or batch < limit:
        events = [event(task, batch, i) for i in range(rng.randint(1, 12))]
        try:
            records = await log.append(events, term=1, time_unix_s=0.0)
        except LogUnavailable as exc:
            print(f"UNAVAILABLE {exc}", flush=True)
            return
        print(f"ACK {records[0].seq} {records[-1].seq} {task} {batch}", flush=True)
        batch += 1


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("--fsize-limit", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None)
    args = parser.parse_args()
    if args.fsize_limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize_limit, args.fsize_limit))
    log = EmbeddedLog(args.directory, segment_bytes=64 * 1024)
    print(f"OPEN {log.head_seq} {log.truncated_bytes}", flush=True)
    rng = random.Random(sys.argv[1])
    await asyncio.gather(*(appender(log, t, random.Random(rng.random()), args.batches) for t in range(8)))
    log.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
