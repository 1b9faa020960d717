"""Supervisor failover with agents and training attached: leader kills, reconnects, fencing, etcd rates.

One run, real processes: a 3-member etcd cluster (on disk unless --dir says otherwise), three
supervisor replicas, agents running the example trainer. Each trial SIGKILLs the leading replica
and times (a) until the new leader's first append (its LeaderElected record, stamped with the wall
time it was appended) and (b) until every agent is connected to the new leader; then it checks
that every record acknowledged before the kill is still in the log unchanged, tries an append at
the dead leader's term (fencing must reject it), and restarts the killed replica so each trial
starts from three. Before the trials: fenced appends with batches of events per transaction beside
raw sequential puts, same client, same cluster. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import grpc

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ftsup.harness.cluster import ClusterSpec, LocalCluster  # noqa: E402
from ftsup.harness.demo import trainer_argv  # noqa: E402
from ftsup.supervisor.core.events import NodeCleared, OperatorCommand  # noqa: E402
from ftsup.supervisor.eventlog.api import Deposed  # noqa: E402
from ftsup.supervisor.eventlog.etcd import EtcdLog, make_client  # noqa: E402
from ftsup.supervisor.leader import LeaderElection  # noqa: E402
from ftsup.v1 import events_pb2, operator_pb2, operator_pb2_grpc  # noqa: E402
from tests.support.etcd_cluster import EtcdCluster  # noqa: E402

PREFIX = "/bench/failover/job"


def say(text: str) -> None:
    print(f"[failover] {text}", file=sys.stderr, flush=True)


# -- etcd rates -------------------------------------------------------------------------------
async def append_rate(log: EtcdLog, batch: int, total: int, term: int) -> float:
    """Events/s through fenced appends of `batch` events per transaction, one appender."""
    events = [NodeCleared(f"n{i}", "bench") for i in range(batch)]
    started = time.perf_counter()
    for _ in range(total // batch):
        await log.append(events, term=term, time_unix_s=0.0)
    return (total // batch) * batch / (time.perf_counter() - started)


async def raw_put_rate(client: Any, total: int) -> float:
    payload = b"x" * 40
    started = time.perf_counter()
    for i in range(total):
        await client.put(f"/bench/raw/{i:020d}".encode(), payload)
    return total / (time.perf_counter() - started)


async def measure_rates(endpoints: list[str], batch: int, total: int) -> dict[str, float]:
    client = make_client(endpoints)
    try:
        election = LeaderElection(client, "/bench/rates", "bench:1")
        leader = await election.run_until_leader()
        result: dict[str, float] = {}
        for size, key in ((batch, "append_eps"), (1, "append_eps_unbatched")):
            log = await EtcdLog.open(client, f"/bench/rates/{size}", fence_key=election.key)
            result[key] = round(await append_rate(log, size, total if size > 1 else total // 4, leader.term), 1)
            await log.aclose()
        await election.resign()
        result["raw_put_eps"] = round(await raw_put_rate(client, total // 4), 1)
        return result
    finally:
        await client.close()


async def stale_append_rejected(endpoints: list[str], term: int) -> bool:
    """An append at a deposed term, as the dead leader would make it: True when fencing refused it."""
    client = make_client(endpoints)
    try:
        election = LeaderElection(client, PREFIX, "bench-probe:1")
        log = await EtcdLog.open(client, PREFIX, fence_key=election.key)
        try:
            probe = OperatorCommand("bench-fence-probe", (), "bench", f"append at deposed term {term}")
            await log.append([probe], term=term, time_unix_s=time.time())
        except Deposed:
            return True
        finally:
            await log.aclose()
        return False
    finally:
        await client.close()


# -- the cluster ----------------------------------------------------------------------------------
def nodes_at(address: str) -> list[operator_pb2.NodeInfo]:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = operator_pb2_grpc.OperatorStub(channel).ListNodes(operator_pb2.ListNodesRequest(), timeout=2)
            return list(reply.nodes)
    except grpc.RpcError:
        return []


def all_connected(address: str, count: int) -> bool:
    nodes = nodes_at(address)
    return len(nodes) == count and all(n.connected for n in nodes)


def key(record: events_pb2.Record) -> tuple[int, int, bytes]:
    return record.seq, record.term, record.event.SerializeToString(deterministic=True)


def one_kill(cluster: LocalCluster, endpoints: list[str], nodes: int, trial: int) -> dict[str, Any]:
    leader = cluster.wait_for(cluster.leader, 60, "a leader")
    cluster.wait_for(lambda: all_connected(leader.address, nodes), 60, "every agent on the leader")
    acknowledged = cluster.events()
    head = acknowledged[-1].seq if acknowledged else 0
    say(f"kill {trial + 1}: SIGKILL the leader {leader.address} (term {leader.term}, head seq {head})")
    killed_at = time.time()
    cluster.kill_supervisor(leader.address)

    def elected() -> events_pb2.Record | None:
        try:
            records = cluster.events(since_seq=head + 1)
        except grpc.RpcError:
            return None
        return next((r for r in records if r.event.WhichOneof("kind") == "leader_elected"
                     and r.term > leader.term), None)

    record = cluster.wait_for(elected, 60, "the new leader's first append", poll_s=0.05)
    successor = record.event.leader_elected.address
    cluster.wait_for(lambda: all_connected(successor, nodes), 60, "every agent on the new leader", poll_s=0.05)
    reconnect_s = time.time() - killed_at
    after = {r.seq: key(r) for r in cluster.events()}
    lost = sum(1 for r in acknowledged if after.get(r.seq) != key(r))
    rejected = asyncio.run(stale_append_rejected(endpoints, leader.term))
    cluster.restart_supervisor(leader.address)
    return {
        "failover_s": round(record.time_unix_s - killed_at, 3),
        "reconnect_s": round(reconnect_s, 3),
        "old_term": leader.term,
        "new_term": record.term,
        "lost_events": lost,
        "stale_append_rejected": rejected,
    }


def dual_leader_appends(records: list[events_pb2.Record]) -> int:
    """Records written at a term older than one already in the log before them."""
    newest, count = 0, 0
    for record in records:
        count += record.term < newest
        newest = max(newest, record.term)
    return count


def run(args: argparse.Namespace, root: pathlib.Path) -> dict[str, Any]:
    with EtcdCluster(root / "etcd") as etcd:
        endpoints = [m.client_url for m in etcd.members]
        say(f"etcd rates: {args.appends} events in batches of {args.batch} vs raw puts")
        result: dict[str, Any] = {"storage": str(root), "lease_ttl_s": 2.0, "nodes": args.nodes,
                                  "batch_events": args.batch}
        result.update(asyncio.run(measure_rates(endpoints, args.batch, args.appends)))
        result["append_vs_raw"] = round(result["append_eps"] / result["raw_put_eps"], 2)
        spec = ClusterSpec(
            nodes=args.nodes, spares=0, ranks_per_node=1, trainer_argv=trainer_argv(sys.executable, 10**6, seed=1),
            supervisors=3, etcd_endpoints=tuple(endpoints), etcd_prefix=PREFIX,
        )
        with LocalCluster(spec, root / "cluster") as cluster:
            say(f"starting 3 supervisor replicas and {args.nodes} agents with the example trainer")
            cluster.start()
            cluster.wait_for(lambda: cluster.trainer_step("node-1") >= 3, 180, "step 3")
            step_before = cluster.trainer_step("node-1")
            trials = [one_kill(cluster, endpoints, args.nodes, i) for i in range(args.kills)]
            step_after = cluster.trainer_step("node-1")
            records = cluster.events()
        generations = sum(1 for r in records if r.event.WhichOneof("kind") == "generation_started")
    result.update({
        "kills": len(trials),
        "failover_s": [t["failover_s"] for t in trials],
        "failover_s_median": statistics.median(t["failover_s"] for t in trials),
        "reconnect_s": [t["reconnect_s"] for t in trials],
        "reconnect_s_median": statistics.median(t["reconnect_s"] for t in trials),
        "lost_events": sum(t["lost_events"] for t in trials),
        "fenced_appends_rejected": sum(t["stale_append_rejected"] for t in trials),
        "stale_appends_tried": len(trials),
        "dual_leader_appends": dual_leader_appends(records),
        "training_restarts": generations - 1,
        "steps_during_trials": step_after - step_before,
        "terms": [[t["old_term"], t["new_term"]] for t in trials],
    })
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench failover", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--kills", type=int, default=5, help="leader SIGKILLs (the median is over these)")
    parser.add_argument("--nodes", type=int, default=3, help="agents, each running one trainer rank")
    parser.add_argument("--appends", type=int, default=4000, help="events appended for the rate figures")
    parser.add_argument("--batch", type=int, default=16, help="events per fenced append transaction")
    parser.add_argument("--dir", type=pathlib.Path, default=None,
                        help="where etcd and the cluster write (default: a fresh directory under /var/tmp, on disk)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for tests")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.appends = 1, 320
    if args.kills < 1 or args.nodes < 1 or args.batch < 1 or args.appends < 4 * args.batch:
        parser.error("--kills, --nodes and --batch must be >= 1 and --appends >= 4 x --batch")
    parent = args.dir or pathlib.Path("/var/tmp")
    parent.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(tempfile.mkdtemp(prefix="ftsup-failover-", dir=parent))
    try:
        result = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
