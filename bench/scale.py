"""Fleet load: simulated agents against one real supervisor; heartbeat latency, CPU, silent-node detection.

One supervisor subprocess (embedded event log in a temp dir) and a few load processes
(harness/fleet_load.py), each holding many real Supervisor.Connect streams. After the fleet is
connected and training (every node holds ranks and sends StepReports), a steady window measures
heartbeat handling latency (send -> HeartbeatAck), supervisor CPU and RSS; midway one node goes
silent with its stream left open, and the time to the supervisor's verdict is measured. Baseline
in the same run: the configured heartbeat interval (the detector cannot beat 1.5 / 2 intervals).
If 1 s heartbeats miss the goal at full size, smaller fleets are swept. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import pathlib
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import grpc

from ftsup.bench import _scale_plot
from ftsup.common import plot
from ftsup.common.shard_map import agent_holders, shard_of
from ftsup.harness import orphan_guard
from ftsup.harness.cluster import ClusterError, free_port, terminate_group
from ftsup.harness.etcd_cluster import EtcdCluster, EtcdClusterError
from ftsup.supervisor.server.server_limits import MAX_STREAMS_PER_CONNECTION
from ftsup.v1 import operator_pb2, operator_pb2_grpc

GOAL_P99_MS = 50.0
GOAL_DETECT_S = 2.5
LATENCY_DEFINITION = (
    "per heartbeat that asks for an ack (one in --ack-every per node at a random phase, and each"
    " session's first; real agents ask none): from the simulated agent handing it to gRPC until it reads the"
    " supervisor's HeartbeatAck, which the supervisor sends after its input loop has admitted and"
    " observed that heartbeat (queueing in the loop included); both ends on this machine. latency_*:"
    " the steady window before the silenced node's silence; latency_after_silence_*: after it (its"
    " detection, the generation's end and the directives that follow)"
)
DETECT_DEFINITION = (
    "from the silenced node's last message (wall clock, load process: a heartbeat, or a step's report"
    " and holdings, which the detector hears as well) to the time stamped on the supervisor's"
    " NodeSuspected / NodeDeclaredDead record for it; its stream stays open. detect_from_last_heartbeat_s:"
    " from its last heartbeat, as measured before 2026-11-29"
)


@dataclass
class LoadProcess:
    process: subprocess.Popen[str]
    count: int
    lines: list[dict[str, Any]] = field(default_factory=list)
    is_probe: bool = False  # --probe-nodes: a few nodes in a process of their own, every heartbeat acked

    def send(self, obj: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(obj) + "\n")
        self.process.stdin.flush()

    def read(self, deadline: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = _readline(self.process.stdout, deadline)
        if not line:
            raise ClusterError(f"load process {self.process.pid} exited (code {self.process.poll()})")
        return json.loads(line)


def _readline(stream: IO[str], deadline: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    if reader.is_alive():
        raise ClusterError("timed out waiting for a load process")
    return box[0]


class EventWatch:
    """Follows the supervisor's event log over the operator API, in a thread."""

    def __init__(self, address: str, since_seq: int) -> None:
        self.verdicts: list[tuple[str, str, float]] = []  # (kind, node_id, record time)
        self._channel = grpc.insecure_channel(address)
        stub = operator_pb2_grpc.OperatorStub(self._channel)
        self._stream = stub.ListEvents(operator_pb2.ListEventsRequest(since_seq=since_seq, follow=True))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for record in self._stream:
                kind = record.event.WhichOneof("kind")
                if kind in ("node_suspected", "node_declared_dead"):
                    node_id = getattr(record.event, kind).node_id
                    self.verdicts.append((kind, node_id, record.time_unix_s))
        except grpc.RpcError:
            pass

    def first(self, kind: str, node_id: str) -> float | None:
        return next((t for k, n, t in list(self.verdicts) if k == kind and n == node_id), None)

    def close(self) -> None:
        self._stream.cancel()
        self._channel.close()


def _cpu_s(pid: int) -> float:
    fields_ = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024.0, 1)
    return 0.0


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


T = TypeVar("T")


def _progress(message: str) -> None:
    print(f"[bench scale] {message}", file=sys.stderr, flush=True)


def _wait(check: Callable[[], T | None], timeout_s: float, what: str, supervisor: subprocess.Popen[bytes],
          poll_s: float = 0.2) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if supervisor.poll() is not None:
            raise ClusterError(f"the supervisor exited (code {supervisor.returncode}) waiting for {what}")
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(poll_s)


FOLD_SERIES = ("ftsup_step_folds_total", "ftsup_step_aggregates_folded_total", "ftsup_snapshots_committed_total")


def _fold_counts(metrics_address: str) -> tuple[float, float, float] | None:
    """The replica's (step folds, aggregates decided inside them, RAM snapshot steps committed)
    from its /metrics, None if it does not answer: how many of a step's per-node aggregates the
    leader decided per fold, and whether the fleet's holdings committed its steps."""
    try:
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=30) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = dict.fromkeys(FOLD_SERIES, 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values[FOLD_SERIES[0]], values[FOLD_SERIES[1]], values[FOLD_SERIES[2]]


SHARD_LIVENESS = "ftsup_shard_liveness_admitted_seconds"
LOOP_LATE = "ftsup_loop_late_seconds"


def _buckets(metrics_address: str, name: str = SHARD_LIVENESS) -> dict[float, float] | None:
    """A histogram's cumulative bucket counts by upper bound from the replica's /metrics, None if
    it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=30) as response:
            text = response.read().decode()
    except OSError:
        return None
    prefix = f'{name}_bucket{{le="'
    counts: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            bound, _, value = line[len(prefix):].partition('"} ')
            counts[float(bound)] = float(value)
    return counts


def _window_quantiles(before: dict[float, float] | None, after: dict[float, float] | None) -> dict[str, Any] | None:
    """A histogram's observations in the window (scraped before and after it): how many, and
    p50/p99 as the upper bound of the bucket that holds each quantile (ms; None past the largest
    finite bound), or None if a scrape went unanswered."""
    if before is None or after is None or not after:
        return None
    bounds = sorted(after)
    window = [after[b] - before.get(b, 0.0) for b in bounds]
    total = window[-1]

    def bound_ms(q: float) -> float | None:
        if not total:
            return None
        rank = q * total
        bound = next(b for b, count in zip(bounds, window) if count >= rank)
        return None if math.isinf(bound) else round(bound * 1000.0, 1)

    return {"count": int(total), "p50_ms_at_most": bound_ms(0.50), "p99_ms_at_most": bound_ms(0.99)}


def _late_figures(before: dict[float, float] | None, after: dict[float, float] | None) -> dict[str, Any] | None:
    """A replica's ticks in the window: how many, p99 of their lateness, and how many woke over
    0.25 s and over 1 s late (ms bounds as in _window_quantiles)."""
    figures = _window_quantiles(before, after)
    if figures is None or after is None or before is None:
        return None
    over = {b: after[b] - before.get(b, 0.0) for b in (0.2, 0.3, 1.0, math.inf) if b in after}
    total = over.get(math.inf, 0.0)
    return {"ticks": figures["count"], "p99_ms_at_most": figures["p99_ms_at_most"],
            "over_300ms": int(total - over.get(0.3, total)), "over_1s": int(total - over.get(1.0, total))}


def _probe_figures(procs: list[LoadProcess], results: list[dict[str, Any]]) -> dict[str, Any]:
    """The probe process's ack latency and loop stall (nothing without --probe-nodes)."""
    probed = [r for proc, r in zip(procs, results) if proc.is_probe]
    if not probed:
        return {}
    latencies = [v for r in probed for v in r["latencies_ms"]]
    return {"probe_nodes": sum(p.count for p in procs if p.is_probe),
            "probe_latency_p50_ms": _percentile(latencies, 0.50), "probe_latency_p99_ms": _percentile(latencies, 0.99),
            "probe_latency_samples": len(latencies), "probe_loop_max_stall_s": probed[0].get("loop_max_stall_s")}


def _status(address: str) -> operator_pb2.GetStatusResponse | None:
    try:
        with grpc.insecure_channel(address) as channel:
            return operator_pb2_grpc.OperatorStub(channel).GetStatus(operator_pb2.GetStatusRequest(), timeout=5)
    except grpc.RpcError:
        return None


def _running(address: str) -> operator_pb2.GetStatusResponse | None:
    status = _status(address)
    if status is not None and status.nodes_quarantined:
        # A healthy node was declared dead while the fleet connected: the supervisor fell behind.
        raise ClusterError(f"{status.nodes_quarantined} node(s) quarantined before training started"
                           f" (dead: {status.nodes_dead}); waiting: {status.waiting_reason or '-'}")
    return status if status is not None and status.phase == operator_pb2.JOB_PHASE_RUNNING else None


def _leader(addresses: list[str]) -> str | None:
    """The address of the replica that leads now, as a replica says; None during an election."""
    for address in addresses:
        try:
            with grpc.insecure_channel(address) as channel:
                reply = operator_pb2_grpc.OperatorStub(channel).GetLeader(operator_pb2.GetLeaderRequest(), timeout=2)
        except grpc.RpcError:
            continue
        if reply.is_leader:
            return reply.address
    return None


def _serving_agents(address: str) -> bool:
    """The replica takes agents (the leader, or a follower whose link shard relays to it)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="ftsup.v1.Supervisor"), timeout=2)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def run_once(args: argparse.Namespace, nodes: int, interval_s: float, workdir: pathlib.Path,
             profile: bool = False, replicas: int = 1) -> dict[str, Any]:
    """One fleet of `nodes` at `interval_s`: connect, train, measure a steady window, silence one node.

    `replicas` > 1: that many supervisor replicas on a private 3-member etcd, each a link shard
    (the simulated agents dial their node's shard); CPU is reported for the leader and each shard."""
    workdir.mkdir(parents=True)
    job = {"name": "scale", "nodes": nodes, "ranks_per_node": args.ranks_per_node, "argv": ["true"]}
    (workdir / "job.json").write_text(json.dumps(job))
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(replicas)]
    metrics_at = {address: f"127.0.0.1:{free_port()}" for address in addresses}
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "PYTHONUNBUFFERED": "1"}
    module = "ftsup.supervisor"
    if profile:
        module = "ftsup.bench._profiled_supervisor"
    dead_after_s = interval_s * args.heartbeat_misses
    window_s = max(args.duration_s, dead_after_s + interval_s + 4.0)
    silence_at_s = window_s - (dead_after_s + interval_s + 2.0)
    # Every process is registered here the moment it starts, and the `try` below covers every start:
    # an error or a stop signal (SIGTERM unwinds, harness/stop_signals.py) at any point stops them all.
    etcd: EtcdCluster | None = None
    procs: list[LoadProcess] = []
    watch: EventWatch | None = None
    supervisors: dict[str, subprocess.Popen[bytes]] = {}
    try:
        if replicas > 1:
            try:
                etcd = EtcdCluster(workdir / "etcd")
                etcd.start()
            except EtcdClusterError as exc:
                raise ClusterError(f"--replicas {replicas} needs a local etcd: {exc}") from exc
        for index, listen in enumerate(addresses):
            argv = [sys.executable, "-m", module, "--listen", listen, "--job", str(workdir / "job.json"),
                    "--heartbeat-interval-s", str(interval_s), "--heartbeat-misses", str(args.heartbeat_misses),
                    "--log-json", "--metrics-listen", metrics_at[listen]]
            argv += (["--etcd", etcd.endpoints, "--etcd-prefix", "/bench-scale"] if etcd is not None
                     else ["--data-dir", str(workdir / "log")])
            name = "supervisor.log" if replicas == 1 else f"supervisor-{index + 1}.log"
            # (each replica profiles into a file of its own: the leader's and every shard's are read)
            its_env = ({**env, "FTSUP_PROFILE_OUT": str(_profile_path(workdir, listen)),
                        "FTSUP_PROFILE_TAIL_OUT": str(_profile_path(workdir, listen, "tail")),
                        "FTSUP_PROFILE_CONNECT_OUT": str(_profile_path(workdir, listen, "connect")),
                        "FTSUP_PROFILE_CLOCK": getattr(args, "profile_clock", "wall")}
                       if profile else env)
            with open(workdir / name, "wb") as sup_log:
                supervisors[listen] = subprocess.Popen(argv, stdout=sup_log, stderr=subprocess.STDOUT, env=its_env,
                                                       start_new_session=True)
            orphan_guard.watch(supervisors[listen])
        supervisor = supervisors[addresses[0]]
        address = addresses[0]
        for listen, process in supervisors.items():
            _wait(functools.partial(_status, listen), 60, f"the supervisor at {listen} to answer", process)
        if replicas > 1:
            address = _wait(lambda: _leader(addresses), 60, "a leader", supervisor)
            supervisor = supervisors[address]  # the failure checks and the event watch follow the leader
            for listen, process in supervisors.items():
                _wait(functools.partial(_serving_agents, listen), 60, f"the replica at {listen} to take agents", process)
        if profile:  # the leader, from here to the window: registration and the generation's start
            # (not the shards: cProfile's cost on them made a 12,500-node fleet fail to connect)
            os.kill(supervisor.pid, signal.SIGUSR1)
        started = time.monotonic()
        step_epoch_s = time.time()  # every load process counts step boundaries from it (synchronous steps)
        probe_nodes = min(getattr(args, "probe_nodes", 0), nodes - 1)
        share, extra = divmod(nodes - probe_nodes, args.procs)
        counts = [share + (1 if index < extra else 0) for index in range(args.procs)]
        first = 0
        for index, count in enumerate(counts + ([probe_nodes] if probe_nodes > 0 else [])):
            if count == 0:
                continue
            is_probe = index == len(counts)
            load_argv = [sys.executable, "-m", "ftsup.harness.fleet_load", "--address", ",".join(addresses),
                         "--first", str(first),
                         "--count", str(count), "--interval-s", str(interval_s), "--step-s", str(args.step_s),
                         "--step-epoch-s", str(step_epoch_s), "--streams-per-channel", str(args.streams_per_channel), "--seed", str(index + 1),
                         "--ack-every", str(1 if is_probe else args.ack_every), *(["--old-agents"] if args.old_agents else []),
                         "--leader", address, *(["--snapshot-reports"] if args.snapshot_reports else [])]
            with open(workdir / f"load-{index}.log", "wb") as load_log:
                load = subprocess.Popen(load_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=load_log, env=env, text=True, start_new_session=True)
            orphan_guard.watch(load)
            procs.append(LoadProcess(load, count, is_probe=is_probe))
            first += count
        welcomed = [0] * len(procs)
        late_while_connecting = 0  # heartbeats the load processes sent >10% of an interval late
        deadline = time.monotonic() + args.connect_timeout_s
        checked = time.monotonic()
        for i, proc in enumerate(procs):
            while True:
                line = proc.read(deadline)
                welcomed[i] = line["welcomed"]
                _progress(f"{interval_s:g}s x {nodes}: {sum(welcomed)}/{nodes} nodes welcomed"
                          f" ({line['connect_s']:.0f}s)")
                if time.monotonic() - checked >= 2.0:
                    # Fail fast: a healthy node declared dead while the fleet connects means the
                    # supervisor fell behind, and the run cannot reach a steady window.
                    checked = time.monotonic()
                    status = _status(address)
                    if status is not None and (status.nodes_dead or status.nodes_quarantined):
                        raise ClusterError(
                            f"{status.nodes_dead} dead / {status.nodes_quarantined} quarantined node(s) while"
                            f" connecting ({sum(welcomed)}/{nodes} welcomed after {time.monotonic() - started:.0f}s);"
                            f" the load processes sent {line['late_beats']}+ heartbeats late")
                if line["kind"] == "ready":
                    late_while_connecting += line["late_beats"]
                    break
        connect_s = time.monotonic() - started
        try:
            status = _wait(lambda: _running(address), args.connect_timeout_s,
                           "the generation to run (a step reported)", supervisor, poll_s=0.5)
        except ClusterError as exc:
            raise ClusterError(f"{exc}; the load processes sent {late_while_connecting} heartbeats late"
                               " while connecting") from exc
        train_s = time.monotonic() - started
        _progress(f"{interval_s:g}s x {nodes}: training in generation {status.generation} after {train_s:.1f}s;"
                  f" settling {2 * interval_s:g}s, then measuring {window_s:g}s")
        time.sleep(2 * interval_s)  # a settle period by design: two heartbeats from every node
        watch = EventWatch(address, (_status(address) or status).head_seq + 1)
        target = f"sim-{nodes // 2:06d}"
        owner = next(p for p, lo in zip(procs, _firsts(procs)) if lo <= nodes // 2 < lo + p.count)
        folds0 = _fold_counts(metrics_at[address])  # (before the window: a scrape costs the leader CPU)
        liveness0 = {a: _buckets(metrics_at[a]) for a in supervisors if a != address}
        late0 = {a: _buckets(metrics_at[a], LOOP_LATE) for a in supervisors}
        cpu0 = {a: _cpu_s(p.pid) for a, p in supervisors.items()}
        wall0, wall0_unix = time.monotonic(), time.time()
        if profile:  # (cut: the leader's connect profile written; every replica's window begun)
            for process in supervisors.values():
                os.kill(process.pid, signal.SIGHUP)
        for proc in procs:
            proc.send({"cmd": "measure", "window_s": window_s, "silence": target if proc is owner else None,
                       "silence_at_s": silence_at_s})
        # The window's part before the silence: training alone, no failure's work (the silenced
        # node's detection, the generation's end, its directives and refused tail come after).
        time.sleep(max(0.0, wall0 + silence_at_s - time.monotonic()))
        steady_cpu_by = {a: _cpu_s(p.pid) - cpu0[a] for a, p in supervisors.items()}
        steady_s = time.monotonic() - wall0
        if profile:  # (the profile cut there too: training alone, then the failure's tail)
            for process in supervisors.values():
                os.kill(process.pid, signal.SIGHUP)
        results = [proc.read(time.monotonic() + window_s + 120) for proc in procs]
        cpu_by = {a: _cpu_s(p.pid) - cpu0[a] for a, p in supervisors.items()}
        folds1 = _fold_counts(metrics_at[address])  # (after the window's CPU was read)
        liveness1 = {a: _buckets(metrics_at[a]) for a in supervisors if a != address}
        late1 = {a: _buckets(metrics_at[a], LOOP_LATE) for a in supervisors}
        wall_s = time.monotonic() - wall0
        cpu_s = cpu_by[address]
        holders = agent_holders(addresses, address) if replicas > 1 else {address}
        if profile:
            for process in supervisors.values():
                os.kill(process.pid, signal.SIGUSR2)
        rss_mb = _rss_mb(supervisor.pid)
        silenced = next(r for r in results if r["silenced"])
        last_beat = silenced["last_beat_wall_s"]
        last_message = silenced.get("last_message_wall_s") or last_beat
        dead_at = _wait_optional(lambda: watch.first("node_declared_dead", target), dead_after_s + 10)
        suspect_at = watch.first("node_suspected", target)
        first_judged: dict[str, float] = {}  # node -> its first verdict's time (unix)
        for _, node, at in list(watch.verdicts):
            first_judged.setdefault(node, at)
        false_verdicts = sorted(n for n in first_judged if n != target)
        latencies = [v for r in results for v in r["latencies_ms"]]
        after = [v for r in results for v in r["after_ms"]]
        sent, acked = sum(r["sent"] for r in results), sum(r["acked"] for r in results)
        asked = sum(r.get("asked", r["sent"]) for r in results)
        load_cpu_s = sum(r["cpu_s"] for r in results)
        out: dict[str, Any] = {
            "nodes": nodes,
            "gpus": nodes * args.ranks_per_node,
            "heartbeat_interval_s": interval_s,
            "nodes_connected": sum(r["welcomed"] for r in results),
            "nodes_training": sum(r["running"] for r in results),
            "connect_s": round(connect_s, 2),
            "connect_to_training_s": round(train_s, 2),
            "window_s": round(wall_s, 2),
            "heartbeats_sent": sent,
            "heartbeats_asked_ack": asked,
            "heartbeats_acked": acked,
            "heartbeats_per_s": round(sent / wall_s, 1),
            "step_reports_per_s": round(sum(r["step_reports"] for r in results) / wall_s, 1),  # aggregates: one per node-step
            "snapshot_reports_per_s": round(sum(r.get("snapshot_reports", 0) for r in results) / wall_s, 1),
            # the messages that carried them: two SnapshotHoldings per node-step (its own, its buddy copies)
            "snapshot_messages_per_s": round(sum(r.get("snapshot_messages", 0) for r in results) / wall_s, 1),
            # The leader's folds in the window: each decides several nodes' aggregates of a step as one
            "leader_step_folds": (None if folds0 is None or folds1 is None else {
                "folds": int(folds1[0] - folds0[0]), "aggregates": int(folds1[1] - folds0[1]),
                "aggregates_per_fold": round((folds1[1] - folds0[1]) / max(folds1[0] - folds0[0], 1), 1)}),
            # What the nodes were sent in the window: whole directives, and SnapshotRetain notices
            # (a commit's retain floor, in place of a directive to every node: --old-agents takes none)
            "directives_received": sum(r.get("directives", 0) for r in results),
            "retain_notices_received": sum(r.get("retains", 0) for r in results),
            # RAM snapshot steps the leader committed in the window (--snapshot-reports: about one a step)
            "snapshot_commits": None if folds0 is None or folds1 is None else int(folds1[2] - folds0[2]),
            "late_heartbeats": sum(r["late_beats"] for r in results),
            **_silent_at_source(results, false_verdicts, 1.5 * interval_s),
            "latency_p50_ms": _percentile(latencies, 0.50),
            "latency_p99_ms": _percentile(latencies, 0.99),
            "latency_max_ms": max(latencies) if latencies else None,
            "latency_mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
            "latency_samples": len(latencies),
            # Per shard: its liveness summaries in the window, each one's oldest heartbeat read on the
            # shard to the leader's admission. Measured on the shard, this leaves out the load
            # generator's own lateness and the shard's reading, which the agents' ack latency includes.
            "shard_liveness_admitted": {a: _window_quantiles(liveness0[a], liveness1[a]) for a in liveness0},
            # --probe-nodes: the same latency for a few nodes whose load process is nearly idle, so
            # that its own lateness is not in it (the shards' reading and the leader's admission are)
            **_probe_figures(procs, results),
            # Per replica (the leader first): how late its loop woke its 0.1 s ticker in the window
            "loop_late": {a: _late_figures(late0[a], late1[a]) for a in sorted(late0, key=lambda a: a != address)},
            "latency_after_silence_p50_ms": _percentile(after, 0.50),
            "latency_after_silence_p99_ms": _percentile(after, 0.99),
            "latency_after_silence_max_ms": max(after) if after else None,
            "supervisor_cpu_fraction": round(cpu_s / wall_s, 3),  # the leader's, with replicas
            # ...and in the window's first `steady_window_s`, before the silenced node's silence
            # (None when the window is too short to leave one: the smoke test's)
            "steady_window_s": round(steady_s, 2),
            "leader_cpu_fraction_steady": round(steady_cpu_by[address] / steady_s, 3) if steady_s >= 1.0 else None,
            "leader_cpu_us_per_node_s_steady": (round(steady_cpu_by[address] / steady_s / nodes * 1e6, 2)
                                                if steady_s >= 1.0 else None),
            "shard_cpu_fractions_steady": ({a: round(c / steady_s, 3) for a, c in steady_cpu_by.items() if a != address}
                                           if steady_s >= 1.0 else None),
            "replicas": replicas,
            "shard_cpu_fractions": {a: round(c / wall_s, 3) for a, c in cpu_by.items() if a != address},
            "supervisors_cpu_fraction": round(sum(cpu_by.values()) / wall_s, 3),
            "leader_holds_agents": address in holders,
            # CPU per node-second of fleet time: what one more node costs the leader / a shard.
            "leader_cpu_us_per_node_s": round(cpu_s / wall_s / nodes * 1e6, 2),
            "shard_cpu_us_per_node_s": {a: round(c / wall_s / max(1, sum(
                1 for i in range(nodes) if shard_of(f"sim-{i:06d}", holders) == a)) * 1e6, 2)
                for a, c in cpu_by.items() if a != address},
            "supervisor_rss_mb": rss_mb,
            "load_cpu_fraction": round(load_cpu_s / wall_s, 3),
            # Each load process's event loop: the longest it woke late in the window, and when (s
            # into the window). A starved generator sends late and its nodes look silent: read
            # false verdicts against this.
            "load_loop_max_stall_s": [r.get("loop_max_stall_s") for r in results],
            "load_loop_max_stall_at_s": [round(r["loop_max_stall_at_wall_s"] - wall0_unix, 2)
                                         if r.get("loop_max_stall_at_wall_s") else None for r in results],
            "load_loop_stalls_over_1s": [r.get("loop_stalls_over_1s") for r in results],
            "load_processes": len(procs),
            # This machine's load average (1 min) at the window's end: other tenants' CPU use skews every figure.
            "machine_loadavg_1m": round(os.getloadavg()[0], 2),
            "silenced_node": target,
            "suspect_s": round(suspect_at - last_message, 3) if suspect_at and last_message else None,
            "detect_s": round(dead_at - last_message, 3) if dead_at and last_message else None,
            # (as measured before 2026-11-29: from its last heartbeat, though a step's report and
            # holdings may follow it and reset the node's silence)
            "detect_from_last_heartbeat_s": round(dead_at - last_beat, 3) if dead_at and last_beat else None,
            "detect_limit_s": dead_after_s,
            "false_verdicts": len(false_verdicts),
            "false_verdict_nodes": false_verdicts[:10],
            # ...of which first judged after the window (the load processes' gaps end with it)
            "false_verdicts_after_window": sum(1 for n in false_verdicts if first_judged[n] > wall0_unix + window_s),
        }
        out["goal_met"] = bool(
            out["nodes_training"] == nodes and out["latency_p99_ms"] is not None
            and out["latency_p99_ms"] <= GOAL_P99_MS and out["detect_s"] is not None
            and out["detect_s"] <= max(GOAL_DETECT_S, dead_after_s + 0.5) and not false_verdicts
            and acked >= 0.99 * asked
        )
        if getattr(args, "kill_shard", False) and replicas > 1 and not profile:
            out["shard_kill"] = _kill_a_shard(supervisors, address, holders, nodes, procs, watch, dead_after_s,
                                              interval_s)
        if getattr(args, "kill_leader", False) and replicas > 1 and not profile:
            out["leader_kill"] = _kill_the_leader(supervisors, address, procs, dead_after_s, interval_s)
        if profile:
            out["profile_top"] = _profile_top(_profile_path(workdir, address))  # before the silence
            out["profile_top_tail"] = _profile_top(_profile_path(workdir, address, "tail"))
            out["profile_top_connect"] = _profile_top(_profile_path(workdir, address, "connect"))
            if replicas > 1:
                out["shard_profile_top"] = {a: _profile_top(_profile_path(workdir, a)) for a in supervisors if a != address}
        _progress(f"{interval_s:g}s x {nodes}: p50 {out['latency_p50_ms']} ms, p99 {out['latency_p99_ms']} ms,"
                  f" cpu {out['supervisor_cpu_fraction']} (before the silence {out['leader_cpu_fraction_steady']}),"
                  f" detect {out['detect_s']} s")
        return out
    finally:
        if watch is not None:
            watch.close()
        for proc in procs:
            try:
                proc.send({"cmd": "stop"})
            except (BrokenPipeError, OSError):
                pass
        for proc in procs:
            terminate_group(proc.process, grace_s=10.0)
        for process in supervisors.values():
            terminate_group(process, grace_s=10.0)
        if etcd is not None:
            etcd.close()


def _kill_a_shard(supervisors: dict[str, subprocess.Popen[bytes]], leader: str, holders: set[str], nodes: int,
                  procs: list[LoadProcess], watch: EventWatch, dead_after_s: float, interval_s: float) -> dict[str, Any]:
    """SIGKILLs the follower holding the most nodes (a rack-sized event, issue 14): its nodes' streams
    end, they dial their next shard naming the dead one, and the leader must hear each again before
    it would judge them. Reports when each was heard again (seconds after the kill: p50, max) and
    the verdicts after the kill (the goal: none). Not whether training goes on: the silenced node's
    death has ended the generation by then (tests/integration/test_link_shards.py kills a shard
    under real training)."""
    homes = [shard_of(f"sim-{i:06d}", holders) for i in range(nodes)]
    victim = max((a for a in holders if a != leader), key=homes.count)
    killed_at = time.time()
    os.kill(supervisors[victim].pid, signal.SIGKILL)
    timeout_s = 4 * dead_after_s + 30.0
    for proc in procs:
        proc.send({"cmd": "rehome", "killed": victim, "killed_at": killed_at, "timeout_s": timeout_s})
    replies = [proc.read(time.monotonic() + timeout_s + 60) for proc in procs]
    heard = sorted(t for r in replies for t in r["heard_again_s"])
    moved = sum(r["moved"] for r in replies)
    result = {
        "killed": victim,
        "nodes_on_it": homes.count(victim),
        "moved": moved,
        "heard_again": len(heard),
        **_after_a_kill("heard_again", heard, watch, killed_at, dead_after_s + interval_s),
    }
    _progress(f"shard {victim} killed: {len(heard)}/{moved} of its nodes heard again elsewhere within"
              f" {result['heard_again_max_s']} s; {result['deaths_after_kill']} deaths,"
              f" {result['suspects_after_kill']} suspects after the kill")
    return result


def _kill_the_leader(supervisors: dict[str, subprocess.Popen[bytes]], leader: str, procs: list[LoadProcess],
                     dead_after_s: float, interval_s: float) -> dict[str, Any]:
    """SIGKILLs the leader (issue 14, part 10): a follower is elected, the followers' relays move to
    it and replay their agents' Hellos through the streams they kept (or, with --old-agents, end
    them: every node redials). Reports when the new leader was elected, when each node was welcomed
    by it (seconds after the kill: p50, max), how many redialled, and the verdicts after the kill
    (from the new leader's log; the goal: none)."""
    killed_at = time.time()
    os.kill(supervisors[leader].pid, signal.SIGKILL)
    survivors = [a for a in supervisors if a != leader]
    successor = _wait(lambda: _leader(survivors), 60, "a new leader", supervisors[survivors[0]], poll_s=0.05)
    elected_s = time.time() - killed_at
    timeout_s = 4 * dead_after_s + 60.0
    for proc in procs:
        proc.send({"cmd": "rewelcome", "killed_at": killed_at, "timeout_s": timeout_s})
    replies = [proc.read(time.monotonic() + timeout_s + 60) for proc in procs]
    welcomed = sorted(t for r in replies for t in r["welcomed_s"])
    watch = EventWatch(successor, 1)  # (the whole log: the kill's verdicts are told by their time)
    try:
        figures = _after_a_kill("welcomed", welcomed, watch, killed_at, dead_after_s + interval_s)
    finally:
        watch.close()
    result = {
        "killed": leader,
        "new_leader": successor,
        "elected_s": round(elected_s, 3),
        "nodes": sum(r["nodes"] for r in replies),
        "welcomed_again": len(welcomed),
        "redialled": sum(r["redialled"] for r in replies),
        **figures,
    }
    _progress(f"leader {leader} killed: {successor} elected after {result['elected_s']} s; {len(welcomed)}/"
              f"{result['nodes']} nodes welcomed by it within {result['welcomed_max_s']} s, {result['redialled']}"
              f" redialled; {result['deaths_after_kill']} deaths, {result['suspects_after_kill']} suspects")
    return result


def _after_a_kill(what: str, seconds: list[float], watch: EventWatch, killed_at: float,
                  settle_s: float) -> dict[str, Any]:
    """A kill's figures: the p50 and max of `seconds` (sorted; when each node was `what` after the
    kill), and the verdicts after it, read once the detector had `settle_s` (one allowance of
    silence past the last node back) to judge anyone it would."""
    settle_until = time.monotonic() + settle_s
    while time.monotonic() < settle_until:
        time.sleep(0.2)  # (waiting out a window in which nothing must happen)
    after = [(kind, node) for kind, node, at in list(watch.verdicts) if at >= killed_at]
    return {
        f"{what}_p50_s": seconds[len(seconds) // 2] if seconds else None,
        f"{what}_max_s": seconds[-1] if seconds else None,
        "deaths_after_kill": sum(1 for kind, _ in after if kind == "node_declared_dead"),
        "suspects_after_kill": sum(1 for kind, _ in after if kind == "node_suspected"),
        "verdict_nodes": sorted({node for _, node in after})[:10],
    }


def _firsts(procs: list[LoadProcess]) -> list[int]:
    firsts, at = [], 0
    for proc in procs:
        firsts.append(at)
        at += proc.count
    return firsts


def _wait_optional(check: Callable[[], T | None], timeout_s: float) -> T | None:
    deadline = time.monotonic() + timeout_s
    while (value := check()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def _profile_path(workdir: pathlib.Path, listen: str, part: str = "") -> pathlib.Path:
    """A replica's profile of the window before the silence, or of its `part` ("tail": the rest;
    "connect": from the first Hello to the window, the generation's start included)."""
    return workdir / f"supervisor-{listen.replace(':', '_')}{'-' + part if part else ''}.prof"


def _profile_top(path: pathlib.Path, limit: int = 15) -> list[dict[str, Any]]:
    # SIGUSR2 makes the supervisor write the file asynchronously: wait until it loads whole.
    deadline = time.monotonic() + 30.0
    while True:
        try:
            stats = pstats.Stats(str(path))
            break
        except (OSError, EOFError, ValueError, TypeError):
            if time.monotonic() > deadline:
                return []
            time.sleep(0.5)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:limit]  # type: ignore[attr-defined]
    return [{"function": f"{pathlib.Path(file).name}:{line}({name})", "calls": nc, "tottime_s": round(tt, 3),
             "tottime_share": round(tt / total, 3) if total else 0.0, "cumtime_s": round(ct, 3)}
            for (file, line, name), (_, nc, tt, ct, _) in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench scale", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--nodes", type=int, default=12_500, help="simulated nodes (8 GPUs = 8 ranks each)")
    parser.add_argument("--intervals", default="5,1", help="heartbeat intervals in seconds, comma-separated")
    parser.add_argument("--interval-s", type=float, default=None, help="one interval (overrides --intervals)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="steady measurement window (at least"
                        " long enough to see the silent node declared dead)")
    parser.add_argument("--step-s", type=float, default=10.0,
                        help="each node sends one StepAggregate of its ranks per step (0: none)")
    parser.add_argument("--snapshot-reports", action="store_true",
                        help="each node also reports its holdings every step, as a real agent: its own ranks'"
                        " snapshots and the copies it holds as a buddy (so every step commits)")
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--heartbeat-misses", type=int, default=2)
    parser.add_argument("--procs", type=int, default=2, help="load generator processes")
    parser.add_argument("--probe-nodes", type=int, default=0, metavar="N",
                        help="run the fleet's last N nodes in a load process of their own, every heartbeat acked,"
                             " and report their ack latency apart (probe_latency_p50_ms/p99): a process that is"
                             " nearly idle, so the latency without the load generator's own lateness")
    parser.add_argument("--replicas", default="1", help="supervisor replicas, comma-separated counts run side by side"
                        " (e.g. 1,3): above 1, replicas on a private 3-member etcd, each a link shard")
    parser.add_argument("--streams-per-channel", type=int, default=25)
    parser.add_argument("--ack-every", type=int, default=10,
                        help="one heartbeat in N per node asks for an ack, whose latency is measured (and each"
                        " session's first); real agents ask none; 1: every heartbeat (the bench before 2026-11-28)")
    parser.add_argument("--connect-timeout-s", type=float, default=900.0)
    parser.add_argument("--sweep", default="1000,2500,5000,10000",
                        help="node counts tried at 1 s when the full fleet misses the goal ('' : no sweep)")
    parser.add_argument("--kill-shard", action="store_true",
                        help="with --replicas above 1: after the window, SIGKILL the follower holding the most nodes"
                             " and report when each of its nodes was heard again elsewhere, and any verdict")
    parser.add_argument("--kill-leader", action="store_true",
                        help="with --replicas above 1: after the window, SIGKILL the leader and report when the new"
                             " one welcomed each node (through kept streams), how many redialled, and any verdict")
    parser.add_argument("--old-agents", action="store_true",
                        help="the simulated agents are those before 2026-11-28: they do not resync on a second"
                             " Welcome (a shard ends their streams at a leader change: the baseline of --kill-leader)"
                             " nor take a SnapshotRetain (each commit sends every node a whole directive: the"
                             " baseline of --snapshot-reports)")
    parser.add_argument("--profile", action="store_true",
                        help="also run the full fleet at the last interval under cProfile and report the top functions "
                             "before the silence (profile_top) and after it (profile_top_tail)")
    parser.add_argument("--profile-clock", choices=("wall", "cpu"), default="wall",
                        help="what --profile's times count: wall time (a function's share includes the loop's idle"
                             " poll and any wait for a CPU), or the process's CPU time (where its CPU went, on a"
                             " machine whose cores are all busy; each timing is a system call, so it costs more)")
    parser.add_argument("--workdir", type=pathlib.Path, default=None,
                        help="keep the supervisor's and load processes' logs here (default: a temp dir, removed)")
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="also draw latency p50/p99 and supervisor CPU against nodes (needs ftsup[plot])")
    parser.add_argument("--from-json", type=pathlib.Path, default=None, metavar="FILE",
                        help="with --plot: draw a saved result instead of running the benchmark")
    args = parser.parse_args(argv)
    if args.kill_shard and args.kill_leader:
        parser.error("--kill-shard and --kill-leader: one kill per run")
    target = None
    if args.plot:
        try:
            target = plot.check_target(args.plot)
            plot.pyplot()  # a missing matplotlib is said now, not after the benchmark
        except (ValueError, plot.PlotUnavailable) as exc:
            parser.error(str(exc))
    if args.from_json is not None:
        if target is None:
            parser.error("--from-json draws a saved result: add --plot FILE.png")
        try:
            saved = json.loads(args.from_json.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--from-json {str(args.from_json)!r}: not a readable JSON result ({exc})")
        if not isinstance(saved, dict) or not isinstance(saved.get("runs"), dict):
            parser.error(f"--from-json {str(args.from_json)!r}: not an `ftsup bench scale` result (no \"runs\")")
        _scale_plot.draw(_scale_plot.plot_data(saved), target)
        _progress(f"wrote {target}")
        return 0
    try:
        intervals = [args.interval_s] if args.interval_s else [float(v) for v in args.intervals.split(",") if v.strip()]
        sweep = sorted(int(v) for v in args.sweep.split(",") if v.strip())
        replica_counts = [int(v) for v in args.replicas.split(",") if v.strip()]
    except ValueError as exc:
        parser.error(f"bad --intervals/--interval-s/--sweep/--replicas: {exc}")
    if not replica_counts or any(not 1 <= r <= 7 for r in replica_counts):
        parser.error(f"--replicas must name counts within [1, 7], got {args.replicas!r}")
    if not 1 <= args.nodes <= 100_000 or not intervals or any(not 0 < i <= 60 for i in intervals):
        parser.error(f"--nodes must be within [1, 100000] and intervals within (0, 60]; got {args.nodes}, {intervals}")
    if not 1 <= args.procs <= 16 or args.duration_s <= 0 or args.step_s < 0:
        parser.error(f"--procs within [1, 16], --duration-s > 0, --step-s >= 0; got {args.procs}, "
                     f"{args.duration_s}, {args.step_s}")
    if not 1 <= args.ack_every <= 1000:
        parser.error(f"--ack-every within [1, 1000], got {args.ack_every}")
    if not 0 <= args.probe_nodes <= 1000 or args.probe_nodes * 2 >= args.nodes > 1:
        parser.error(f"--probe-nodes within [0, 1000] and under half the fleet, got {args.probe_nodes}")
    if not 1 <= args.streams_per_channel <= MAX_STREAMS_PER_CONNECTION:
        parser.error(f"--streams-per-channel within [1, {MAX_STREAMS_PER_CONNECTION}] (the supervisor's streams per"
                     f" connection), got {args.streams_per_channel}")
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus": args.nodes * args.ranks_per_node,
        "cpus": os.cpu_count(),
        "load_processes": args.procs,
        "streams_per_channel": args.streams_per_channel,
        "ack_every": args.ack_every,
        "step_s": args.step_s,
        "latency_definition": LATENCY_DEFINITION,
        "detect_definition": DETECT_DEFINITION,
        "goal": {"nodes": args.nodes, "heartbeat_interval_s": 1.0, "latency_p99_ms": GOAL_P99_MS,
                 "detect_s": GOAL_DETECT_S},
        "baseline": {"name": "detector floor: suspect at 1.5 and dead at heartbeat_misses intervals",
                     "suspect_s": {f"{i:g}": 1.5 * i for i in intervals},
                     "dead_s": {f"{i:g}": i * args.heartbeat_misses for i in intervals}},
        "runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="ftsup-bench-scale-") as tmp:
        root = args.workdir or pathlib.Path(tmp)
        if replica_counts != [1]:
            # Link shards: each count's runs side by side (the same machine, the same minutes), so
            # the gain is a ratio; `runs` keeps the first count's for the plot.
            result["replicas"] = replica_counts
            result["runs_by_replicas"] = {}
            for count in replica_counts:
                result["runs_by_replicas"][str(count)] = {
                    f"{interval:g}": _safe(args, args.nodes, interval, root / f"run-{interval:g}-r{count}",
                                           replicas=count) for interval in intervals}
            result["runs"] = result["runs_by_replicas"][str(replica_counts[0])]
            if args.profile:  # the leader of the last count: what link shards leave on it
                result["profile"] = _safe(args, args.nodes, intervals[-1], root / "profile", profile=True,
                                          replicas=replica_counts[-1])
            print(json.dumps(result))
            return 0
        for interval in intervals:
            result["runs"][f"{interval:g}"] = _safe(args, args.nodes, interval, root / f"run-{interval:g}")
        one_s = result["runs"].get("1")
        if one_s is not None:
            result["goal_met"] = bool(one_s.get("goal_met"))
        if one_s is not None and not one_s.get("goal_met") and sweep:
            result["sweep_1s"] = {}
            for count in [c for c in sweep if c < args.nodes]:
                run = _safe(args, count, 1.0, root / f"sweep-{count}")
                result["sweep_1s"][str(count)] = run
                if not run.get("goal_met"):
                    break
            passing = [int(c) for c, r in result["sweep_1s"].items() if r.get("goal_met")]
            result["largest_passing_nodes_1s"] = max(passing) if passing else 0
        if args.profile:
            result["profile"] = _safe(args, args.nodes, intervals[-1], root / "profile", profile=True)
    print(json.dumps(result))
    if target is not None:
        _scale_plot.draw(_scale_plot.plot_data(result), target)
        _progress(f"wrote {target}")
    return 0


# A node the load generator itself left silent this close to the suspicion threshold (1.5
# intervals), or longer, can be suspected with no fault of the supervisor: a shard's summary
# gathers for up to 0.1 s and the detector judges on a 0.1 s Tick.
SOURCE_SLACK_S = 0.2


def _silent_at_source(results: list[dict[str, Any]], false_verdicts: list[str], suspect_after_s: float
                      ) -> dict[str, Any]:
    """Whether the false verdicts' nodes were silent where they came from: the load processes'
    longest gap between handing a node's messages to gRPC (`send_gap_s`) and its longest wait in
    one write (`write_wait_s`: gRPC's flow control, the receiving shard not reading)."""
    gaps = {node: gap for r in results for node, gap in r.get("send_gaps_s", {}).items()}
    waits = {node: wait for r in results for node, wait in r.get("write_waits_s", {}).items()}
    threshold = suspect_after_s - SOURCE_SLACK_S
    return {
        "nodes_silent_at_source": sum(1 for gap in gaps.values() if gap >= threshold),
        "false_verdicts_silent_at_source": sum(1 for node in false_verdicts if gaps.get(node, 0.0) >= threshold),
        "false_verdict_sources": {node: {"send_gap_s": gaps.get(node), "write_wait_s": waits.get(node)}
                                  for node in false_verdicts[:20]},
    }


def _safe(args: argparse.Namespace, nodes: int, interval: float, workdir: pathlib.Path,
          profile: bool = False, replicas: int = 1) -> dict[str, Any]:
    """A run that breaks (supervisor overwhelmed, connect timeout) is a result, not a crash. A run
    that failed, or measured something no healthy run shows (false verdicts, no detection of the
    silenced node, a sharded leader that decided no step fold), keeps its logs even without
    --workdir (`logs_kept`, `logs_kept_because`): such a run, seen once in a dozen, cannot be
    explained from its figures alone."""
    try:
        out = run_once(args, nodes, interval, workdir, profile, replicas)
    except ClusterError as exc:
        _progress(f"{interval:g}s x {nodes}: failed: {exc}")
        out = {"nodes": nodes, "heartbeat_interval_s": interval, "goal_met": False, "error": str(exc)}
    reasons = unexplained(out)
    if reasons and args.workdir is None and workdir.is_dir():
        kept = pathlib.Path(tempfile.mkdtemp(prefix="ftsup-bench-scale-logs-"))
        for path in workdir.iterdir():
            if path.is_file() and path.suffix in (".log", ".json"):
                shutil.copy2(path, kept / path.name)
        out["logs_kept"] = str(kept)
        out["logs_kept_because"] = reasons
        _progress(f"{interval:g}s x {nodes}: {'; '.join(reasons)}; the run's logs are kept in {kept}")
    return out


def unexplained(run: dict[str, Any]) -> list[str]:
    """What in a run's figures its logs must explain (empty for a healthy run)."""
    reasons = []
    if run.get("error"):
        reasons.append("the run failed")
    if run.get("false_verdicts"):
        reasons.append(f"{run['false_verdicts']} false verdicts")
    if not run.get("error") and run.get("detect_s") is None:
        reasons.append("the silenced node was not declared dead")
    folds = run.get("leader_step_folds")
    if run.get("replicas", 1) > 1 and isinstance(folds, dict) and folds.get("folds") == 0:
        reasons.append("the leader decided no step fold")
    return reasons


if __name__ == "__main__":
    sys.exit(main())
