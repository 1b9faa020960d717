"""Event log throughput and replay: the embedded log against SQLite (WAL, synchronous=FULL).

Same disk, same durability (an append is acknowledged only after its fsync), one run:
appends/s with 1 and 64 concurrent appenders, for the embedded log (group commit) and for SQLite
with one row per event; then replay of 1,000,000 events from zero and from a snapshot.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sqlite3
import sys
import tempfile
import threading
import time
from typing import Any

from ftsup.supervisor import codec
from ftsup.supervisor.core.events import (
    GenerationStarted,
    NodeRegistered,
    NodeRole,
    RankAssignment,
    RankRestore,
    RestoreKind,
    SnapshotCommitted,
)
from ftsup.supervisor.core.evolve import apply_records
from ftsup.supervisor.core.state import ClusterState
from ftsup.supervisor.eventlog.embedded import EmbeddedLog

NODES = 64


def typical_events(count: int) -> list[Any]:
    """A long run's log: nodes register, a generation starts, then one commit per step."""
    events: list[Any] = [NodeRegistered(f"node-{i:05d}", i + 1, NodeRole.ACTIVE, f"10.0.{i // 250}.{i % 250}",
                                        7071, 8) for i in range(NODES)]
    ids = [f"node-{i:05d}" for i in range(NODES)]
    members = tuple(RankAssignment(n, tuple(range(i * 8, i * 8 + 8)), ids[(i + 1) % NODES]) for i, n in enumerate(ids))
    restores = tuple(RankRestore(r, RestoreKind.FRESH, "") for r in range(NODES * 8))
    events.append(GenerationStarted(1, members, NODES * 8, "10.0.0.0", 29501, None, 0, restores, "first generation"))
    step = 0
    while len(events) < count:
        step += 1
        events.append(SnapshotCommitted(1, step))
    return events[:count]


async def embedded_appends(directory: pathlib.Path, appenders: int, total: int) -> float:
    log = EmbeddedLog(directory)
    events = typical_events(total)
    per_task = total // appenders

    async def task(index: int) -> None:
        for i in range(per_task):
            await log.append([events[index * per_task + i]], term=1, time_unix_s=0.0)

    started = time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(appenders)))
    elapsed = time.perf_counter() - started
    log.close()
    return appenders * per_task / elapsed


def sqlite_appends(path: pathlib.Path, appenders: int, total: int) -> float:
    setup = sqlite3.connect(path)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, term INTEGER, time REAL, event BLOB)")
    setup.commit()
    setup.close()
    payloads = [codec.event_to_proto(e).SerializeToString() for e in typical_events(total)]
    per_thread = total // appenders

    def worker(index: int) -> None:
        connection = sqlite3.connect(path, timeout=60, isolation_level=None)
        connection.execute("PRAGMA synchronous=FULL")
        for i in range(per_thread):
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO events (term, time, event) VALUES (1, 0.0, ?)",
                               (payloads[index * per_thread + i],))
            connection.execute("COMMIT")  # acknowledged = durable, as for the embedded log
        connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(appenders)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return appenders * per_thread / (time.perf_counter() - started)


async def build_large_log(directory: pathlib.Path, count: int) -> ClusterState:
    log = EmbeddedLog(directory)
    events = typical_events(count)
    for start in range(0, count, 5000):
        await log.append(events[start : start + 5000], term=1, time_unix_s=0.0)
    state = apply_records(ClusterState(), log.read(1))
    log.close()
    return state


def replay(directory: pathlib.Path, *, use_snapshot: bool) -> tuple[float, ClusterState]:
    started = time.perf_counter()
    log = EmbeddedLog(directory)
    state = (log.load_snapshot() if use_snapshot else None) or ClusterState()
    state = apply_records(state, log.read(state.applied_seq + 1))
    elapsed = time.perf_counter() - started
    log.close()
    return elapsed, state


async def run(args: argparse.Namespace, root: pathlib.Path, say: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"disk": str(root), "durability": "acknowledged after fsync"}
    say("embedded log, 1 appender")
    result["append_eps_1"] = round(await embedded_appends(root / "e1", 1, args.appends_1), 1)
    say("embedded log, 64 appenders")
    result["append_eps_64"] = round(await embedded_appends(root / "e64", 64, args.appends_64), 1)
    say("sqlite (WAL, synchronous=FULL), 1 and 64 appenders")
    result["sqlite_eps_1"] = round(sqlite_appends(root / "s1.db", 1, args.appends_1), 1)
    result["sqlite_eps_64"] = round(sqlite_appends(root / "s64.db", 64, args.sqlite_64), 1)
    result["ratio_1"] = round(result["append_eps_1"] / result["sqlite_eps_1"], 2)
    result["ratio_64"] = round(result["append_eps_64"] / result["sqlite_eps_64"], 2)
    say(f"building a log of {args.replay_events:,} events")
    folded = await build_large_log(root / "big", args.replay_events)
    seconds, state = replay(root / "big", use_snapshot=False)
    assert state == folded, "replay from zero must rebuild the same state"
    result["replay_events"] = args.replay_events
    result["replay_1m_s" if args.replay_events == 1_000_000 else "replay_s"] = round(seconds, 3)
    say("snapshot near the head, then replay from it")
    log = EmbeddedLog(root / "big")
    await log.save_snapshot(folded)
    log.close()
    seconds, state = replay(root / "big", use_snapshot=True)
    assert state == folded
    result["replay_from_snapshot_s"] = round(seconds, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench eventlog", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="where to write (default: a temp dir on /var/tmp)")
    parser.add_argument("--appends-1", type=int, default=2000)
    parser.add_argument("--appends-64", type=int, default=64 * 400)
    parser.add_argument("--sqlite-64", type=int, default=64 * 40)
    parser.add_argument("--replay-events", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="small sizes, for tests")
    args = parser.parse_args(argv)
    if args.quick:
        args.appends_1, args.appends_64, args.sqlite_64, args.replay_events = 50, 64 * 4, 64, 5000

    def say(text: str) -> None:
        print(f"bench eventlog: {text}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="ftsup-bench-", dir=args.dir or "/var/tmp") as tmp:
        result = asyncio.run(run(args, pathlib.Path(tmp), say))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
