"""The replicated log on a real 3-member etcd (tmpfs): fenced appends/s and leader failover time.

One run: a 3-member etcd cluster on loopback, data on tmpfs; fenced appends (one transaction each,
comparing head and leader key) with 1 and 16 concurrent appenders (the 16 are group-committed),
raw sequential puts with the same client, and the embedded log on the same tmpfs as the baseline;
then N leader failovers: a candidate process holding the leader key is SIGKILLed and we time until
a waiting candidate leads (lease TTL 2 s). Needs `etcd` on PATH and a checkout (it reuses
tests/support/etcd_cluster.py). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ftsup.common.deadline import within  # noqa: E402
from ftsup.harness import orphan_guard  # noqa: E402
from ftsup.supervisor.core.events import NodeCleared  # noqa: E402
from ftsup.supervisor.eventlog.embedded import EmbeddedLog  # noqa: E402
from ftsup.supervisor.eventlog.etcd import EtcdLog, make_client  # noqa: E402
from ftsup.supervisor.leader import LeaderElection  # noqa: E402
from tests.support.etcd_cluster import EtcdCluster, tmpfs_root  # noqa: E402


async def appends(log: Any, appenders: int, total: int, term: int) -> float:
    per_task = total // appenders

    async def task(index: int) -> None:
        for i in range(per_task):
            await log.append([NodeCleared(f"t{index}", str(i))], term=term, time_unix_s=0.0)

    started = time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(appenders)))
    return appenders * per_task / (time.perf_counter() - started)


async def raw_puts(client: Any, prefix: str, total: int) -> float:
    payload = b"x" * 40
    started = time.perf_counter()
    for i in range(total):
        await client.put(f"{prefix}/raw/{i:020d}".encode(), payload)
    return total / (time.perf_counter() - started)


async def one_failover(cluster: EtcdCluster, client: Any, prefix: str) -> float:
    endpoints = ",".join(f"127.0.0.1:{m.client_port}" for m in cluster.members)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.leader_candidate", endpoints, prefix, "victim:1"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
    )  # fmt: skip
    orphan_guard.watch(proc)
    try:
        assert proc.stdout is not None  # stdout=PIPE
        line = await within(asyncio.to_thread(proc.stdout.readline), 30)
        if not line.startswith("LEADER"):
            raise RuntimeError(f"candidate did not lead: {line!r}")
        successor = LeaderElection(client, prefix, "successor:1")
        waiting = asyncio.create_task(successor.run_until_leader())
        await asyncio.sleep(0.5)  # the successor is now watching the key
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        await within(waiting, 10)
        took = time.monotonic() - killed_at
        await successor.resign()
        return took
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def run(args: argparse.Namespace, say: Any) -> dict[str, Any]:
    root = args.dir or tmpfs_root("bench-etcd")
    try:
        return await measure(args, root, say)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def measure(args: argparse.Namespace, root: pathlib.Path, say: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"storage": f"tmpfs ({root})", "etcd_members": 3, "lease_ttl_s": 2}
    with EtcdCluster(root / "etcd") as cluster:
        client = make_client([m.client_url for m in cluster.members])
        election = LeaderElection(client, "/bench/fenced", "bench:1")
        leader = await election.run_until_leader()
        for appenders, total in ((1, args.appends_1), (16, args.appends_16)):
            say(f"etcd: fenced appends, {appenders} appender(s)")
            log = await EtcdLog.open(client, f"/bench/fenced/{appenders}", fence_key=election.key)
            result[f"append_eps_{appenders}"] = round(await appends(log, appenders, total, leader.term), 1)
            await log.aclose()
        await election.resign()
        say("etcd: raw sequential puts, same client")
        result["raw_put_eps"] = round(await raw_puts(client, "/bench", args.appends_1), 1)
        result["append_vs_raw_1"] = round(result["append_eps_1"] / result["raw_put_eps"], 2)
        say("embedded log on the same tmpfs (baseline)")
        for appenders, total in ((1, args.appends_1), (16, args.appends_16)):
            embedded = EmbeddedLog(root / f"embedded{appenders}")
            result[f"embedded_eps_{appenders}"] = round(await appends(embedded, appenders, total, 1), 1)
            embedded.close()
        times = []
        for trial in range(args.failovers):
            say(f"failover {trial + 1}/{args.failovers}: SIGKILL the leader key's holder")
            times.append(await one_failover(cluster, client, f"/bench/failover/{trial}"))
        result["failover_s"] = [round(t, 3) for t in times]
        result["failover_s_median"] = round(statistics.median(times), 3)
        await client.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench etcd_log", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="where etcd and the embedded log write")
    parser.add_argument("--appends-1", type=int, default=2000)
    parser.add_argument("--appends-16", type=int, default=16 * 300)
    parser.add_argument("--failovers", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, for tests")
    args = parser.parse_args(argv)
    if args.quick:
        args.appends_1, args.appends_16, args.failovers = 100, 16 * 10, 1

    def say(text: str) -> None:
        print(f"[etcd_log] {text}", file=sys.stderr, flush=True)

    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        args.dir = pathlib.Path(tempfile.mkdtemp(prefix="etcd-log-", dir=args.dir))
    result = asyncio.run(run(args, say))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
