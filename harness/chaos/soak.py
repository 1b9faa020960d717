"""`ftsup chaos soak`: one long job through N mixed failures, then every resource back to its baseline.

The scenarios (scenarios.py) each break a fresh cluster once; a leak that grows a little per
recovery never shows there. The soak runs ONE job and breaks it N times in rotation (node kill,
hung trainer, Xid 79, the buddy killed while it receives a snapshot, a cut of an agent's
supervisor stream, a trainer crash), each as soon as the previous recovery completed (a step
committed after it), replacing consumed nodes with fresh spares as an operator would. Then it
checks what must come back: per recovery the lost steps; at the end the final digest equal to the
offline reference run's, every agent's arriving snapshot bytes 0 and its held snapshots within
the retention bound, warm pools refilled, the supervisor's and agents' RSS, open fds, threads
and asyncio tasks within stated growth limits of their baselines (read from /proc and the
agents' /metrics), the event log within its compaction bound, and no generation that restarted
without progress. Each violated bound is named in `problems`; `main.py` exits 1 on any.

With `--etcd` the supervisor is three replicas on a local 3-member etcd cluster and the rotation
adds `leader_kill` (SIGKILL of the leading replica, restarted as systemd would once a new leader
is elected; training must go on without a restart). Each agent then reaches every replica through
a proxy of its own per replica; a replica's usage is compared only while the same process lives
from baseline to end (a killed one restarts from nothing), and the event log's bound is read from
etcd (records and out-of-line blobs under the job's prefix).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import re
import signal
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from ftsup.agent.core.retention import KEEP_STEPS_PER_RANK
from ftsup.harness.chaos import attribution, checks
from ftsup.harness.chaos.attribution import CONSUMES_NODE, RESTARTS, Steady
from ftsup.harness.chaos.log_follower import LogFollower
from ftsup.harness.chaos.proxy import PartitionProxy
from ftsup.harness.chaos.reference import ReferenceKey, trainer_base_argv
from ftsup.harness.chaos.runner import HEARTBEAT_INTERVAL_S, HEARTBEAT_MISSES, RECONNECT_GRACE_S, RunContext
from ftsup.harness.cluster import ClusterError, ClusterSpec, LocalCluster, free_port, terminate_group, wait_until
from ftsup.supervisor.eventlog.embedded import DEFAULT_SEGMENT_BYTES, KEEP_SNAPSHOTS
from ftsup.v1 import events_pb2, operator_pb2

KINDS = ("node_kill", "hung_trainer", "xid_79", "buddy_loss_in_handoff", "stream_cut", "trainer_crash")
ETCD_KINDS = (*KINDS, "leader_kill")  # with --etcd: three replicas, the leader killed in turn
REPLICAS = 3  # with --etcd
LEADER_KILL_STEPS = 40  # steps trained while a killed replica restarts and the soak waits for it
HANG_FLAGS = ("--hang-multiple", "10", "--hang-floor-s", "3", "--hang-startup-s", "120")
NODES = 3
SNAPSHOT_EVERY = 100  # the supervisor's --snapshot-every: the compaction bound follows from it
STEPS_BETWEEN = 2  # steps committed after a recovery before the next failure (buddies hold copies)
PROTECTED = "node-1"  # never consumed: one agent lives from the first baseline to the end


@dataclass(frozen=True, slots=True)
class Limits:
    """Growth allowed from a process's baseline (taken in steady training before the first failure)
    to the same point after the last recovery; the event log's bound is in records."""

    rss_growth_mib: float = 96.0
    fd_growth: int = 16
    thread_growth: int = 8
    task_growth: int = 16


@dataclass(frozen=True, slots=True)
class Usage:
    rss_kib: int
    fds: int
    threads: int
    tasks: int | None  # asyncio tasks from /metrics; None when it did not answer


@dataclass
class Failure:
    index: int
    kind: str
    node: str
    step: int
    generation: int
    detail: str = ""
    detected_s: float | None = None
    recovered_s: float | None = None
    lost_steps: int | None = None
    recovered_generation: int = 0
    # The log's side of it (attribution.py): the last seq read before the fault, the record that
    # ended the broken generation because of it (restarting kinds), the one that completed recovery.
    break_seq: int = 0
    cause_seq: int | None = None
    recovered_seq: int | None = None
    leader_term: int = 0  # leader_kill: the killed leader's term (recovery is committed in a newer one)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("detected_s", "recovered_s"):
            out[key] = None if out[key] is None else round(out[key], 3)
        return out


@dataclass
class SoakResult:
    passed: bool = False
    failures: list[Failure] = field(default_factory=list)
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    final_digest: str = ""
    reference_digest: str = ""
    steps: int = 0
    duration_s: float = 0.0
    workdir: str = ""
    compacted_unread: int = 0  # records compacted before the soak read them (etcd; see log_follower.py)

    def summary(self) -> dict[str, Any]:
        return {"soak": True, "passed": self.passed, "failures": len(self.failures), "steps": self.steps,
                "lost_steps_total": sum(f.lost_steps or 0 for f in self.failures),
                "bitwise_match": bool(self.final_digest) and self.final_digest == self.reference_digest,
                "baselines": self.baselines, "problems": self.problems, "duration_s": round(self.duration_s, 1),
                "compacted_unread": self.compacted_unread,
                "workdir": self.workdir}


def proc_usage(pid: int) -> tuple[int, int, int] | None:
    """(VmRSS KiB, open fds, threads) of a live process, from /proc; None when it is gone or a
    zombie (it exited between the caller's poll and this read: a zombie has no VmRSS line)."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    rss = re.search(r"^VmRSS:\s+(\d+)", status, re.MULTILINE)
    threads = re.search(r"^Threads:\s+(\d+)", status, re.MULTILINE)
    if rss is None or threads is None:
        return None
    return int(rss.group(1)), fds, int(threads.group(1))


def scrape(address: str) -> dict[str, float]:
    """A /metrics page as {"name{labels}": value}; {} when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
            body = reply.read().decode()
    except OSError:
        return {}
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[re.sub(r"\{.*\}", "", name)] = float(value)
    return out


def growth_problems(who: str, base: Usage, end: Usage, limits: Limits) -> list[str]:
    """The bounds a process's usage broke between its baseline and the end, each named."""
    problems = []
    if (end.rss_kib - base.rss_kib) / 1024 > limits.rss_growth_mib:
        problems.append(f"{who}: RSS grew {(end.rss_kib - base.rss_kib) / 1024:.1f} MiB > {limits.rss_growth_mib:g} MiB"
                        f" ({base.rss_kib} -> {end.rss_kib} KiB)")
    if end.fds - base.fds > limits.fd_growth:
        problems.append(f"{who}: open fds grew {end.fds - base.fds} > {limits.fd_growth} ({base.fds} -> {end.fds})")
    if end.threads - base.threads > limits.thread_growth:
        problems.append(f"{who}: threads grew {end.threads - base.threads} > {limits.thread_growth}"
                        f" ({base.threads} -> {end.threads})")
    if base.tasks is not None and end.tasks is not None and end.tasks - base.tasks > limits.task_growth:
        problems.append(f"{who}: asyncio tasks grew {end.tasks - base.tasks} > {limits.task_growth}"
                        f" ({base.tasks} -> {end.tasks})")
    return problems


def log_bound_problems(head_seq: int, segments: dict[int, int], snapshots: list[int], snapshot_every: int,
                       segment_bytes: int = DEFAULT_SEGMENT_BYTES, slack: int = 64) -> list[str]:
    """The embedded log's compaction bound (supervisor/eventlog/embedded.py): at most KEEP_SNAPSHOTS
    snapshots, the newest within `snapshot_every` records (plus a batch of `slack`) of the head, and
    no segment kept that the older snapshot wholly covers. Compaction drops whole segments
    (`segment_bytes` each), so the records kept are bounded in bytes, not in count: a short job's
    log stays in its first segment. `segments`: first seq -> bytes."""
    problems = []
    if len(snapshots) > KEEP_SNAPSHOTS:
        problems.append(f"the event log keeps {len(snapshots)} snapshots > {KEEP_SNAPSHOTS}: {snapshots}")
    if head_seq > snapshot_every + slack and (not snapshots or head_seq - snapshots[-1] > snapshot_every + slack):
        newest = snapshots[-1] if snapshots else 0
        problems.append(f"the event log's newest snapshot (seq {newest}) is {head_seq - newest} records behind the"
                        f" head {head_seq} > --snapshot-every {snapshot_every} + {slack}")
    firsts = sorted(segments)
    covered = [first for first, following in zip(firsts, firsts[1:]) if snapshots and following <= snapshots[0] + 1]
    if covered:
        problems.append(f"the event log keeps {len(covered)} segment(s) its older snapshot (seq {snapshots[0]})"
                        f" covers, from seq {covered[0]}")
    total = sum(segments.values())
    if total > 2 * segment_bytes:
        problems.append(f"the event log's segments hold {total} bytes > 2 x {segment_bytes}")
    return problems


def compaction_filled(records: list[events_pb2.Record], compacted_unread: set[int]) -> list[events_pb2.Record]:
    """The records read, with a placeholder for each seq compacted before it could be read, in order."""
    read = {r.seq: r for r in records}
    return [read.get(seq) or events_pb2.Record(seq=seq) for seq in sorted(set(read) | compacted_unread)]


def etcd_bound_problems(head_seq: int, records: int, blobs: int, snapshot_every: int, slack: int = 64) -> list[str]:
    """The etcd log's compaction bound (supervisor/eventlog/etcd.py): records back to the older of
    the two retained snapshots, so at most 2 x `snapshot_every` (plus a batch of `slack`); blobs:
    at most the two snapshots' and those of records still kept (a few GenerationStarted)."""
    problems = []
    bound = 2 * snapshot_every + slack
    if head_seq > bound and records > bound:
        problems.append(f"etcd holds {records} log records > 2 x --snapshot-every {snapshot_every} + {slack}")
    if blobs > 2 + records:
        problems.append(f"etcd holds {blobs} out-of-line blobs for {records} records and 2 snapshots")
    return problems


async def etcd_key_counts(endpoints: tuple[str, ...], prefix: str) -> tuple[int, int]:
    """(log keys, distinct blobs) under the job's etcd prefix. A key is one record, or a span of a
    decision's records past one transaction's op limit (never at a soak's few nodes): the bound
    above then counts a span once, which only loosens it."""
    from ftsup.supervisor.eventlog.etcd import make_client

    client = make_client(list(endpoints), timeout_s=10.0)
    try:
        records = len(list(await client.get_prefix(f"{prefix}/log/".encode(), keys_only=True)))
        root = f"{prefix}/blob/".encode()
        blobs = {kv.key[len(root):].split(b"/", 1)[0] for kv in await client.get_prefix(root, keys_only=True)}
        return records, len(blobs)
    finally:
        await client.close()


def restarts_without_progress(records: list[events_pb2.Record]) -> list[str]:
    """Generations that ended (not completed) without a step beyond the one they restored."""
    restored = {g.generation: (g.restore_step if g.HasField("restore_step") else 0)
                for g in checks.of_kind(records, "generation_started")}
    return [f"generation {e.generation} ended ({events_pb2.EndReason.Name(e.reason)}) at step {e.last_step} without"
            f" progress beyond its restore step {restored.get(e.generation, 0)}"
            for e in checks.of_kind(records, "generation_ended")
            if e.reason != events_pb2.END_REASON_COMPLETED and e.last_step <= restored.get(e.generation, 0)]


class Soak:
    """One soak run: the cluster, a proxy and a metrics port per agent, the failures so far."""

    def __init__(self, ctx: RunContext, failures: int, limits: Limits = Limits(), seed: int = 7, *,
                 use_etcd: bool = False) -> None:
        if failures < 1:
            raise ValueError(f"a soak needs at least 1 failure, got {failures}")
        self.ctx, self.count, self.limits, self.seed = ctx, failures, limits, seed
        self.use_etcd = use_etcd
        self.kinds = ETCD_KINDS if use_etcd else KINDS
        self.etcd_prefix = f"/ftsup-soak/{uuid.uuid4().hex[:8]}" if use_etcd else ""
        self.replica_pids: dict[str, int] = {}  # address -> the replica process sampled at the baseline
        # Enough steps for every failure, its re-trained steps and the steps between, plus a tail;
        # a leader kill also trains on while the killed replica starts again (~20 steps here).
        leader_kills = sum(1 for i in range(failures) if self.kinds[i % len(self.kinds)] == "leader_kill")
        self.steps = 6 + failures * (STEPS_BETWEEN + 4) + leader_kills * LEADER_KILL_STEPS
        self.workdir = ctx.workdir / "soak"
        self.proxies: dict[str, list[PartitionProxy]] = {}  # node -> one proxy per supervisor replica
        self.metrics: dict[str, str] = {}
        self.follower: LogFollower | None = None  # the soak's copy of the log, set when the run starts
        self.spares_started = 0
        self.cluster: LocalCluster | None = None
        self.supervisor_metrics = ""  # the supervisor's /metrics address, set when the run starts

    # -- the cluster ------------------------------------------------------------------------------
    def spec(self) -> ClusterSpec:
        etcd = self.ctx.etcd() if self.use_etcd else None
        return ClusterSpec(
            nodes=NODES, spares=0, ranks_per_node=1,
            trainer_argv=trainer_base_argv(sys.executable, self.steps, self.seed),
            heartbeat_interval_s=HEARTBEAT_INTERVAL_S, heartbeat_misses=HEARTBEAT_MISSES,
            reconnect_grace_s=RECONNECT_GRACE_S, job_name="chaos-soak", warm_trainers=1, agent_args=HANG_FLAGS,
            supervisor_args=("--snapshot-every", str(SNAPSHOT_EVERY)),
            supervisors=REPLICAS if etcd is not None else 1,
            etcd_endpoints=tuple(etcd.endpoints.split(",")) if etcd is not None else (),
            etcd_prefix=self.etcd_prefix,
        )  # fmt: skip

    def start_agent(self, node_id: str, role: str) -> None:
        assert self.cluster is not None
        proxies = [PartitionProxy(address) for address in self.cluster.addresses]
        self.proxies[node_id] = proxies
        self.cluster.agent_routes[node_id] = ",".join(proxy.address for proxy in proxies)
        self.metrics[node_id] = f"127.0.0.1:{free_port()}"
        self.cluster.start_agent(node_id, role, ("--metrics-listen", self.metrics[node_id]))

    def add_spare(self) -> str:
        self.spares_started += 1
        node_id = f"spare-{self.spares_started}"
        self.start_agent(node_id, "spare")
        return node_id

    def retire(self, node_id: str) -> None:
        """A node out of the job for good (killed, or quarantined and alive): stop it, drop its proxy."""
        assert self.cluster is not None
        node = self.cluster.agents[node_id]
        terminate_group(node.process)
        node.is_killed = True
        self.close_proxies(node_id)

    def close_proxies(self, node_id: str) -> None:
        for proxy in self.proxies.pop(node_id, []):
            proxy.close()

    def live_agents(self) -> list[str]:
        assert self.cluster is not None
        return [n for n, a in self.cluster.agents.items() if not a.is_killed and a.process.poll() is None]

    # -- reading the job --------------------------------------------------------------------------
    def status(self) -> operator_pb2.GetStatusResponse | None:
        assert self.cluster is not None
        try:
            return self.cluster.status()
        except grpc.RpcError:
            return None

    def fetch_records(self) -> list[events_pb2.Record]:
        """Every record seen so far (log_follower.py keeps them as they are appended)."""
        assert self.follower is not None
        return self.follower.records()

    def usage(self, pid: int, metrics: str) -> Usage | None:
        """None when the process is gone (it is then left out of the sample)."""
        found = proc_usage(pid)
        if found is None:
            return None
        rss, fds, threads = found
        tasks = scrape(metrics).get("ftsup_asyncio_tasks") if metrics else None
        return Usage(rss, fds, threads, None if tasks is None else int(tasks))

    def sample(self) -> dict[str, Usage]:
        assert self.cluster is not None and self.cluster.supervisor is not None
        found: dict[str, Usage | None] = {}
        if self.use_etcd:  # every replica still running the process sampled at the baseline
            for address, process in self.cluster.replicas.items():
                if process.poll() is None and self.replica_pids.setdefault(address, process.pid) == process.pid:
                    found[f"supervisor@{address}"] = self.usage(process.pid, "")
        else:
            found["supervisor"] = self.usage(self.cluster.supervisor.pid, self.supervisor_metrics)
        for node_id in self.live_agents():
            found[node_id] = self.usage(self.cluster.agents[node_id].process.pid, self.metrics[node_id])
        return {who: usage for who, usage in found.items() if usage is not None}

    def wait_steady(self, generation_at_least: int,
                    step_above: int) -> tuple[operator_pb2.GetStatusResponse, Steady, int]:
        """Training in a generation >= `generation_at_least` that the leader's status and the log
        agree runs, every member live and fit (attribution.steady_members), STEPS_BETWEEN steps
        past `step_above`: the state a failure may be injected into. Also the last seq of the
        records that decided it: what the log appends after it may be the next fault's doing."""
        assert self.cluster is not None

        def steady() -> tuple[operator_pb2.GetStatusResponse, Steady, int] | None:
            s = self.status()
            if s is None or s.phase != operator_pb2.JOB_PHASE_RUNNING or s.generation < generation_at_least \
                    or s.step < step_above + STEPS_BETWEEN:
                return None
            records = self.fetch_records()
            now = attribution.steady_members(records, self.live_agents())
            return (s, now, records[-1].seq) if now is not None and now.generation == s.generation else None

        return self.cluster.wait_for(
            steady, self.ctx.timeout_s, f"training past step {step_above + STEPS_BETWEEN} in a generation >="
            f" {generation_at_least} whose members are all live and fit")

    # -- the failures -----------------------------------------------------------------------------
    def trainer_pid(self, node_id: str, rank: int, generation: int) -> int:
        cluster = self.cluster
        assert cluster is not None
        return wait_until(lambda: cluster.trainer_pid(node_id, rank, generation), 30,
                          f"the pid of rank {rank} of generation {generation} on {node_id}")

    def break_once(self, index: int, kind: str, generation_at_least: int, step_above: int) -> Failure:
        """Waits for a steady generation, breaks it once with `kind`, waits for this failure's own
        recovery (attribution.attribute) and reads its figures from the records it owns."""
        assert self.cluster is not None
        status, steady, break_seq = self.wait_steady(generation_at_least, step_above)
        node = attribution.pick_victim(kind, steady, PROTECTED)
        if node is None:
            raise ClusterError(f"failure {index} ({kind}): no member of generation {steady.generation} may be"
                               f" taken ({', '.join(steady.members)}; {PROTECTED} is protected)")
        failure = Failure(index, kind, node, status.step, steady.generation, break_seq=break_seq)
        if kind == "node_kill":
            at = self.cluster.kill_node(node)
            failure.detail = "SIGKILL of the agent and its rank"
        elif kind in ("hung_trainer", "trainer_crash"):
            pid = self.trainer_pid(node, steady.ranks[node], steady.generation)
            at = time.time()
            os.kill(pid, signal.SIGSTOP if kind == "hung_trainer" else signal.SIGKILL)
            failure.detail = f"{'SIGSTOP' if kind == 'hung_trainer' else 'SIGKILL'} of rank pid {pid}"
        elif kind == "xid_79":
            at = self.cluster.inject_xid(node, 79, "GPU has fallen off the bus.")
            failure.detail = "Xid 79 in the kernel log"
        elif kind == "buddy_loss_in_handoff":
            at, in_flight = self.kill_while_receiving(node)
            failure.detail = ("SIGKILL while it received a buddy snapshot" if in_flight else
                              "SIGKILL of a buddy (no snapshot stream was seen in flight within 10 s)")
        elif kind == "stream_cut":
            at = time.time()
            for proxy in self.proxies[node]:
                proxy.cut()
            failure.detail = "its agent's connections to the supervisor cut (EOF/reset both ways)"
        elif kind == "leader_kill":
            at, failure.leader_term, failure.detail = self.kill_leader()
        else:
            raise ValueError(f"unknown failure kind {kind!r}")
        owned = self.wait_recovered(failure)
        failure.detected_s = None if owned.verdict is None else owned.verdict.time_unix_s - at
        failure.recovered_s = owned.recovery.time_unix_s - at
        failure.recovered_seq = owned.recovery.seq
        failure.cause_seq = None if owned.cause is None else owned.cause.seq
        failure.recovered_generation = (owned.recovery.event.generation_running.generation if kind in RESTARTS
                                        else failure.generation)
        failure.lost_steps = attribution.lost_steps(owned, failure.step)
        if kind in CONSUMES_NODE:
            if not self.cluster.agents[node].is_killed:
                self.retire(node)
            else:
                self.close_proxies(node)
            self.add_spare()
        return failure

    def kill_leader(self) -> tuple[float, int, str]:
        """SIGKILLs the leading replica; once another leads, starts it again (as systemd would)."""
        cluster = self.cluster
        assert cluster is not None
        leader = cluster.wait_for(cluster.leader, 30, "a leader")
        at = cluster.kill_supervisor(leader.address)
        cluster.wait_for(lambda: (now := cluster.leader()) is not None and now.term > leader.term, 60,
                         "a new leader")
        cluster.restart_supervisor(leader.address)
        self.point_at_leader()
        return (at, int(leader.term),
                f"SIGKILL of the leader replica {leader.address} (term {leader.term}), restarted as a follower")

    def point_at_leader(self) -> None:
        """Queries go to the leading replica: step progress and the job's phase are the leader's
        (a follower's view of them trails, and would hold the soak's pacing back)."""
        cluster = self.cluster
        assert cluster is not None
        if not self.use_etcd:
            return
        leader = cluster.wait_for(cluster.leader, 30, "a leader")
        if cluster.address != leader.address:
            cluster.address = leader.address
            cluster.supervisor = cluster.replicas[leader.address]
            if cluster._channel is not None:
                cluster._channel.close()
                cluster._channel = None

    def kill_while_receiving(self, node: str) -> tuple[float, bool]:
        """SIGKILLs `node` the moment its /metrics shows a snapshot stream arriving (a buddy copy
        in hand-off), or after 10 s of looking."""
        assert self.cluster is not None
        deadline = time.monotonic() + 10.0
        in_flight = False
        while time.monotonic() < deadline:
            if scrape(self.metrics[node]).get("ftsup_agent_snapshot_incoming_bytes", 0) > 0:
                in_flight = True
                break
        return self.cluster.kill_node(node), in_flight

    def wait_recovered(self, failure: Failure) -> attribution.Attribution:
        """This failure's own recovery, attributed from the log's order (attribution.attribute):
        for a restarting kind, a generation started after the record that ended the broken one
        because of this fault ran its first step; for the others, a step committed after it."""
        assert self.cluster is not None

        def done() -> attribution.Attribution | None:
            return attribution.attribute(failure.kind, failure.node, failure.generation, failure.step,
                                         failure.break_seq, self.fetch_records(), failure.leader_term)

        return self.cluster.wait_for(done, self.ctx.timeout_s,
                                     f"recovery from failure {failure.index} ({failure.kind} on {failure.node})")

    # -- the run ----------------------------------------------------------------------------------
    def run(self, on_failure: Callable[[Failure], None] = lambda _f: None) -> SoakResult:
        result = SoakResult(steps=self.steps, workdir=str(self.workdir))
        started = time.monotonic()
        spec = self.spec()
        if not self.use_etcd:  # one replica: its /metrics gives the asyncio task count
            self.supervisor_metrics = f"127.0.0.1:{free_port()}"
            spec = dataclasses.replace(
                spec, supervisor_args=spec.supervisor_args + ("--metrics-listen", self.supervisor_metrics))
        try:
            with LocalCluster(spec, self.workdir) as cluster:
                self.cluster = cluster
                try:
                    self._run(cluster, result, on_failure)
                finally:
                    if self.follower is not None:
                        self.follower.stop()
                    for node_id in list(self.proxies):
                        self.close_proxies(node_id)
        except ClusterError as exc:
            result.problems.append(str(exc))
        result.duration_s = time.monotonic() - started
        result.passed = not result.problems
        return result

    def _run(self, cluster: LocalCluster, result: SoakResult, on_failure: Callable[[Failure], None]) -> None:
        cluster.start_supervisor_only()
        self.follower = follower = LogFollower(lambda: cluster.address)  # from the first record on
        follower.start()
        for i in range(NODES):
            self.start_agent(f"node-{i + 1}", "active")
        for _ in range(2):
            self.add_spare()
        self.point_at_leader()
        status, _, _ = self.wait_steady(0, 1)
        self.wait_warm_pools()
        baseline = self.sample()
        generation_at_least, step_above = 0, 1
        for index in range(self.count):
            kind = self.kinds[index % len(self.kinds)]
            failure = self.break_once(index + 1, kind, generation_at_least, step_above)
            result.failures.append(failure)
            on_failure(failure)
            self.ctx.say(f"[soak] failure {index + 1}/{self.count} {kind} on {failure.node}: "
                         f"recovered in {failure.recovered_s}s, {failure.lost_steps} steps lost")
            status = self.status() or status
            if status.phase == operator_pb2.JOB_PHASE_COMPLETED:
                result.problems.append(f"the job completed after {index + 1} of {self.count} failures: too few steps")
                break
            # The next failure waits (in break_once) for the generation this one recovered into.
            generation_at_least, step_above = failure.recovered_generation, failure.step
        else:
            status, _, _ = self.wait_steady(generation_at_least, step_above)
        self.wait_warm_pools()
        end = self.sample()
        for who, base in baseline.items():
            if who in end:
                result.problems += growth_problems(who, base, end[who], self.limits)
        result.baselines = {who: {"baseline": asdict(base), "end": asdict(end[who]) if who in end else None}
                            for who, base in baseline.items()}
        def completed() -> operator_pb2.GetStatusResponse | None:
            s = self.status()
            return s if s is not None and s.phase == operator_pb2.JOB_PHASE_COMPLETED else None

        final = cluster.wait_for(completed, self.ctx.timeout_s, "the job to complete after the last failure")
        result.problems += self.store_problems()
        records = self.fetch_records()
        result.problems += follower.read_problems
        if self.use_etcd:  # holes the soak could not read are compaction's; etcd's own keys are checked
            result.compacted_unread = len(follower.compacted_unread)
            result.problems += checks.gap_problems(compaction_filled(records, follower.compacted_unread))
        else:
            result.problems += checks.gap_problems(records)
        result.problems += restarts_without_progress(records)
        generations = len(checks.of_kind(records, "generation_started"))
        restarting = sum(1 for f in result.failures if f.kind in RESTARTS)
        if generations > 1 + restarting:
            result.problems.append(f"{generations} generations started for {restarting} restarting failures"
                                   f" (expected at most {1 + restarting})")
        result.problems += self.log_problems()
        result.final_digest = final.final_digest
        result.reference_digest = self.ctx.references.digest(ReferenceKey(self.steps, self.seed, NODES))
        if final.step != self.steps:
            result.problems.append(f"the job completed at step {final.step}, not {self.steps}")
        if result.final_digest != result.reference_digest:
            result.problems.append(f"final digest {result.final_digest} != reference {result.reference_digest}")

    def wait_warm_pools(self) -> None:
        """Every live agent's warm pool back to its size (it refills a few seconds after a launch)."""
        cluster = self.cluster
        assert cluster is not None

        def refilled() -> bool:
            return all(scrape(self.metrics[n]).get("ftsup_agent_warm_trainers_idle") == cluster.spec.warm_trainers
                       for n in self.live_agents())

        cluster.wait_for(refilled, 60, "every agent's warm pool refilled")

    def store_problems(self) -> list[str]:
        """Once the job completed: nothing arriving, and holdings within the retention bound."""
        problems = []
        for node_id in self.live_agents():
            def drained(node: str = node_id) -> dict[str, float] | None:
                page = scrape(self.metrics[node])
                return page if page.get("ftsup_agent_snapshot_incoming_bytes") == 0 else None

            try:
                page = wait_until(drained, 15, f"{node_id}'s snapshot_incoming_bytes to reach 0")
            except ClusterError as exc:
                problems.append(f"{node_id}: bytes_incoming != 0 after the job completed ({exc})")
                continue
            # ranks_per_node = 1: its own rank and the one it is buddy for, KEEP steps each.
            bound = 2 * KEEP_STEPS_PER_RANK
            if page.get("ftsup_agent_snapshots", 0) > bound:
                problems.append(f"{node_id}: holds {page['ftsup_agent_snapshots']:g} snapshots > the retention"
                                f" bound {bound} ({page.get('ftsup_agent_snapshot_bytes', 0):g} bytes)")
        return problems

    def log_problems(self) -> list[str]:
        """The event log within its compaction bound: the embedded one on disk (log_bound_problems),
        or etcd's keys under the job's prefix (etcd_bound_problems)."""
        assert self.cluster is not None and self.follower is not None
        try:
            head = self.cluster.events(max(self.follower.head(), 1))[-1].seq
        except (grpc.RpcError, IndexError) as exc:
            return [f"could not read the event log's head: {exc}"]
        if self.use_etcd:
            records, blobs = asyncio.run(etcd_key_counts(self.cluster.spec.etcd_endpoints, self.etcd_prefix))
            return etcd_bound_problems(head, records, blobs, SNAPSHOT_EVERY)
        directory = self.workdir / "supervisor"
        segments = {int(p.stem): p.stat().st_size for p in (directory / "segments").glob("*.seg")}
        snapshots = sorted(int(p.stem) for p in (directory / "snapshots").glob("*.snap"))
        return log_bound_problems(head, segments, snapshots, SNAPSHOT_EVERY)
