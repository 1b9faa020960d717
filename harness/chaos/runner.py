"""Runs one scenario end to end on a real local cluster and judges it.

Start the cluster the scenario asks for (replicas on etcd, a partition proxy in front of one
agent, checkpoints to a directory or to a real S3 server behind a fault-injecting proxy), wait for
training to reach the break step, read the log (what is acknowledged now must survive), break it,
wait for the job to complete, then measure from the event log and check the invariants:
completed, no acknowledged event lost, gapless, no committed checkpoint lost or half-visible (in
the log and, when the job checkpointed, in the store: every manifest names objects that exist with
the recorded SHA-256), and, where the world size stayed the same, the final digest equal to the
offline reference run's. Cluster logs stay in the scenario's work directory for post-mortems.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from ftsup.checkpoint.manifest import Layout
from ftsup.harness.chaos import checks, needs
from ftsup.harness.chaos.proxy import PartitionProxy
from ftsup.harness.chaos.reference import ReferenceKey, References, trainer_base_argv
from ftsup.harness.chaos.s3_proxy import FaultProxy
from ftsup.harness.chaos.scenario import Break, Chaos, CheckpointStore, Outcome, Scenario
from ftsup.harness.chaos.store_checks import StoreView, inspect_store
from ftsup.harness.cluster import ClusterError, ClusterSpec, LocalCluster
from ftsup.harness.etcd_cluster import EtcdCluster
from ftsup.v1 import events_pb2, operator_pb2

HEARTBEAT_INTERVAL_S = 0.5
# 4 misses (2 s of silence) before a death verdict: the 2-core machines this runs on are loaded.
HEARTBEAT_MISSES = 4
RECONNECT_GRACE_S = 1.0
STORE_SETTLE_S = 30.0  # retention runs off the supervisor's loop after the last commit


@dataclass(frozen=True, slots=True)
class S3Endpoint:
    """An S3 server the scenarios may use (plain HTTP: the fault proxy speaks HTTP)."""

    url: str
    bucket: str
    region: str = "us-east-1"
    env: tuple[tuple[str, str], ...] = ()  # credentials of a server the harness started; () = the environment's


@dataclass
class Result:
    scenario: str
    passed: bool | None  # None: skipped
    detected_s: float | None = None
    recovered_s: float | None = None
    lost_steps: int | None = None
    bitwise_match: bool | None = None
    events_lost: int | None = None
    checkpoints_lost: int | None = None
    skipped: str | None = None
    problems: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)  # known ftsup gaps seen (they do not fail the run)
    workdir: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scenario": self.scenario,
            "passed": self.passed,
            "detected_s": _round(self.detected_s),
            "recovered_s": _round(self.recovered_s),
            "lost_steps": self.lost_steps,
            "bitwise_match": self.bitwise_match,
            "events_lost": self.events_lost,
            "checkpoints_lost": self.checkpoints_lost,
        }
        if self.skipped is not None:
            out["skipped"] = self.skipped
        if self.problems:
            out["problems"] = self.problems
        if self.gaps:
            out["gaps"] = self.gaps
        if self.workdir:
            out["workdir"] = self.workdir
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass
class RunContext:
    """What scenarios of one run share: the work directory, reference digests, one etcd cluster."""

    workdir: pathlib.Path
    say: Callable[[str], None]
    etcd_factory: Callable[[], EtcdCluster] | None = None  # pytest passes its session fixture
    timeout_s: float = 300.0
    s3_endpoint: S3Endpoint | None = None  # reuse this S3 server; else one is started on first use
    references: References = field(init=False)
    _etcd: EtcdCluster | None = None
    _owns_etcd: bool = False
    _s3_server: Any = None  # harness.s3_server.S3Server this context started

    def __post_init__(self) -> None:
        self.references = References(self.workdir / "references")

    def etcd(self) -> EtcdCluster:
        if self._etcd is None:
            if self.etcd_factory is not None:
                self._etcd = self.etcd_factory()
            else:
                from ftsup.harness.etcd_cluster import tmpfs_root

                self._etcd = EtcdCluster(tmpfs_root())
                self._etcd.start()
                self._owns_etcd = True
        return self._etcd

    def s3(self) -> S3Endpoint:
        """The S3 server for scenarios that checkpoint to S3: the given one, or a SeaweedFS started now."""
        if self.s3_endpoint is None:
            from ftsup.harness.etcd_cluster import tmpfs_root
            from ftsup.harness.s3_server import REGION, S3Server, S3ServerError

            server = S3Server(tmpfs_root("s3"))
            try:
                server.start()
            except S3ServerError as exc:
                raise ClusterError(f"could not start the S3 server: {exc}") from exc
            self._s3_server = server
            self.s3_endpoint = S3Endpoint(server.endpoint_url, server.bucket, REGION, tuple(server.env().items()))
        return self.s3_endpoint

    def close(self) -> None:
        if self._etcd is not None and self._owns_etcd:
            self._etcd.close()
        self._etcd = None
        if self._s3_server is not None:
            self._s3_server.close()
            self._s3_server = None
            self.s3_endpoint = None


def spec_for(scenario: Scenario, etcd: EtcdCluster | None, supervisor_args: tuple[str, ...] = ()) -> ClusterSpec:
    return ClusterSpec(
        nodes=scenario.nodes, spares=scenario.spares, ranks_per_node=1,
        trainer_argv=trainer_base_argv(sys.executable, scenario.steps, scenario.seed) + scenario.trainer_args,
        heartbeat_interval_s=HEARTBEAT_INTERVAL_S, heartbeat_misses=HEARTBEAT_MISSES,
        reconnect_grace_s=RECONNECT_GRACE_S, job_name=f"chaos-{scenario.name}", warm_trainers=1,
        supervisors=scenario.supervisors,
        etcd_endpoints=tuple(etcd.endpoints.split(",")) if etcd is not None else (),
        etcd_prefix=f"/ftsup-chaos/{scenario.name}-{uuid.uuid4().hex[:8]}" if etcd is not None else "",
        agent_args=scenario.agent_args, supervisor_args=supervisor_args,
    )  # fmt: skip


def checkpoint_args(scenario: Scenario, checkpoints: CheckpointStore | None, region: str = "") -> tuple[str, ...]:
    """The supervisor's --checkpoint-* flags (it passes them on to the trainers)."""
    if checkpoints is None:
        return ()
    args: tuple[str, ...] = ("--checkpoint-location", checkpoints.location,
            "--checkpoint-every-steps", str(scenario.checkpoint_every_steps),
            "--checkpoint-keep", str(scenario.checkpoint_keep))
    if checkpoints.faults is not None:
        args += ("--checkpoint-endpoint", checkpoints.faults.endpoint_url, "--checkpoint-region", region)
    return args


@contextlib.contextmanager
def _environment(pairs: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """Sets variables for the processes spawned meanwhile (credentials reach them only this way)."""
    saved = {name: os.environ.get(name) for name, _ in pairs}
    os.environ.update(dict(pairs))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _open_checkpoints(scenario: Scenario, ctx: RunContext, workdir: pathlib.Path,
                      stack: contextlib.ExitStack) -> tuple[CheckpointStore | None, str]:
    """The job's checkpoint store (and its S3 region), or (None, "") when the scenario does not checkpoint."""
    if not scenario.checkpoint_every_steps:
        return None, ""
    if not scenario.uses_s3:
        from ftsup.checkpoint.local import LocalDirStore

        directory = workdir / "checkpoints"
        local = LocalDirStore(directory)
        stack.callback(local.close)
        return CheckpointStore(str(directory), Layout(""), local), ""
    from ftsup.checkpoint.s3 import S3Config, S3Store

    endpoint = ctx.s3()
    upstream = urllib.parse.urlparse(endpoint.url)
    if upstream.scheme != "http" or not upstream.hostname or not upstream.port:
        raise ClusterError(f"the S3 fault proxy needs an http://HOST:PORT endpoint, got {endpoint.url!r}")
    stack.enter_context(_environment(endpoint.env))
    faults = stack.enter_context(FaultProxy(upstream.hostname, upstream.port))
    prefix = f"chaos/{scenario.name}-{uuid.uuid4().hex[:8]}"
    direct = S3Store(S3Config(bucket=endpoint.bucket, endpoint_url=endpoint.url, region=endpoint.region))
    stack.callback(direct.close)
    return CheckpointStore(f"s3://{endpoint.bucket}/{prefix}", Layout(prefix), direct, faults), endpoint.region


def run_scenario(scenario: Scenario, ctx: RunContext) -> Result:
    workdir = ctx.workdir / scenario.name
    wanted = scenario.needs + (("etcd",) if scenario.uses_etcd else ())
    if scenario.uses_s3 and ctx.s3_endpoint is None:
        wanted += ("s3_server",)
    reason = needs.missing(wanted)
    if reason is not None:
        ctx.say(f"[{scenario.name}] skipped: {reason}")
        return Result(scenario.name, None, skipped=reason)
    ctx.say(f"[{scenario.name}] {scenario.description}; logs in {workdir}")
    etcd = ctx.etcd() if scenario.uses_etcd else None
    try:
        return _run(scenario, ctx, workdir, etcd)
    except ClusterError as exc:
        return Result(scenario.name, False, problems=[str(exc)], workdir=str(workdir))
    finally:
        if etcd is not None:
            etcd.heal()  # the next scenario gets every member back


def _run(scenario: Scenario, ctx: RunContext, workdir: pathlib.Path, etcd: EtcdCluster | None) -> Result:
    with contextlib.ExitStack() as stack:
        checkpoints, region = _open_checkpoints(scenario, ctx, workdir, stack)
        spec = spec_for(scenario, etcd, checkpoint_args(scenario, checkpoints, region))
        cluster = stack.enter_context(LocalCluster(spec, workdir))
        cluster.start_supervisor_only()
        proxy = None
        if scenario.proxied_node:
            proxy = stack.enter_context(PartitionProxy(cluster.address))
            cluster.agent_routes[scenario.proxied_node] = proxy.address
        chaos = Chaos(cluster, ctx.say, proxy=proxy, etcd=etcd, wait_s=min(120.0, ctx.timeout_s),
                      checkpoints=checkpoints)
        if scenario.prepare is not None:
            scenario.prepare(chaos)
        cluster.start_agents()
        started = time.monotonic()
        cluster.wait_for(
            lambda: (s := chaos.status()) is not None and s.phase == operator_pb2.JOB_PHASE_RUNNING
            and s.step >= scenario.break_at_step, ctx.timeout_s, f"step {scenario.break_at_step}",
        )
        acknowledged = tuple(chaos.records())
        brk = scenario.break_it(chaos)
        ctx.say(f"[{scenario.name}] broke at step {brk.step}{' on ' + brk.node if brk.node else ''}"
                f"{': ' + brk.detail if brk.detail else ''}")
        left_s = max(30.0, ctx.timeout_s - (time.monotonic() - started))

        def completed() -> operator_pb2.GetStatusResponse | None:
            s = chaos.status()
            return s if s is not None and s.phase == operator_pb2.JOB_PHASE_COMPLETED else None

        try:
            status = cluster.wait_for(completed, left_s, "the job to complete after the fault")
        except ClusterError as exc:
            return _stuck(scenario, brk, acknowledged, tuple(chaos.records()), exc, workdir)
        store = None
        if checkpoints is not None:
            _wait_no_checkpoint_in_flight(cluster)
            records = tuple(cluster.events())
            store = _settled_store(checkpoints, records, scenario.checkpoint_keep)
        else:
            records = tuple(cluster.events())
    outcome = Outcome(brk, records, acknowledged, status, spec, store)
    return judge(scenario, outcome, ctx, workdir)


def _wait_no_checkpoint_in_flight(cluster: LocalCluster) -> None:
    """The last step's checkpoint may still be committing when the job completes: wait for its outcome."""

    def idle() -> bool:
        try:
            reply = cluster._stub().ListCheckpoints(operator_pb2.ListCheckpointsRequest(), timeout=10)
        except grpc.RpcError:
            return False
        return not reply.pending_checkpoint_id

    cluster.wait_for(idle, 60, "no checkpoint in flight")


def _settled_store(checkpoints: CheckpointStore, records: tuple[events_pb2.Record, ...], keep: int) -> StoreView:
    """The store once retention after the last commit is done (or STORE_SETTLE_S passed)."""
    deadline = time.monotonic() + STORE_SETTLE_S
    while True:
        view = inspect_store(checkpoints.store, checkpoints.layout, records, keep)
        if not view.problems or time.monotonic() > deadline:
            return view
        time.sleep(0.2)  # polling a condition under a deadline


def _stuck(scenario: Scenario, brk: Break, acknowledged: tuple[events_pb2.Record, ...],
           records: tuple[events_pb2.Record, ...], exc: ClusterError, workdir: pathlib.Path) -> Result:
    """The job never completed: what the log shows so far, with its last events as evidence."""
    tail = [f"{r.seq}:{checks.kind(r)}" for r in records[-6:]]
    return Result(
        scenario.name, False,
        detected_s=checks.first_time(records, scenario.verdicts, brk.at),
        events_lost=checks.events_lost(acknowledged, records) if records else None,
        problems=[str(exc), f"last events: {', '.join(tail) or 'none (no replica answered)'}"],
        workdir=str(workdir),
    )  # fmt: skip


def judge(scenario: Scenario, outcome: Outcome, ctx: RunContext, workdir: pathlib.Path) -> Result:
    records, brk, status = outcome.records, outcome.brk, outcome.status
    problems = list(checks.gap_problems(records))
    if status.step != scenario.steps:
        problems.append(f"the job completed at step {status.step}, not {scenario.steps}")
    result = Result(
        scenario.name, False,
        detected_s=checks.first_time(records, scenario.verdicts, brk.at),
        recovered_s=checks.recovered_s(records, brk.at),
        lost_steps=checks.lost_steps(records, brk.at, brk.step),
        events_lost=checks.events_lost(outcome.acknowledged, records),
        checkpoints_lost=checks.checkpoints_lost(outcome.acknowledged, records),
        workdir=str(workdir),
    )  # fmt: skip
    if outcome.store is not None:
        result.checkpoints_lost = (result.checkpoints_lost or 0) + outcome.store.lost
        problems += outcome.store.problems
    problems += brk.problems
    if result.events_lost:
        problems.append(f"{result.events_lost} acknowledged event(s) lost or changed")
    if result.checkpoints_lost:
        problems.append(f"{result.checkpoints_lost} committed checkpoint(s) lost or half-visible")
    if scenario.verdicts and result.detected_s is None:
        problems.append(f"no verdict event ({', '.join(scenario.verdicts)}) after the fault")
    if scenario.same_world:
        world = status.world_size or scenario.nodes
        reference = ctx.references.digest(ReferenceKey(scenario.steps, scenario.seed, world))
        result.bitwise_match = status.final_digest == reference
        if not result.bitwise_match:
            problems.append(f"final digest {status.final_digest} != reference {reference}")
    problems += scenario.expect(outcome)
    result.problems = problems
    result.gaps = scenario.gaps(outcome)
    result.passed = not problems
    return result
