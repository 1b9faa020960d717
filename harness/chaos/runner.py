"""Runs one scenario end to end on a real local cluster and judges it.

Start the cluster the scenario asks for (replicas on etcd, a partition proxy in front of one
agent), wait for training to reach the break step, read the log (what is acknowledged now must
survive), break it, wait for the job to complete, then measure from the event log and check the
invariants: completed, no acknowledged event lost, gapless, no committed checkpoint lost or
half-visible, and, where the world size stayed the same, the final digest equal to the offline
reference run's. Cluster logs stay in the scenario's work directory for post-mortems.
"""

from __future__ import annotations

import contextlib
import pathlib
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ftsup.v1 import events_pb2, operator_pb2
from harness.chaos import checks, needs
from harness.chaos.proxy import PartitionProxy
from harness.chaos.reference import ReferenceKey, References, trainer_base_argv
from harness.chaos.scenario import Break, Chaos, Outcome, Scenario
from harness.cluster import ClusterError, ClusterSpec, LocalCluster
from harness.etcd_cluster import EtcdCluster

HEARTBEAT_INTERVAL_S = 0.5
# 4 misses (2 s of silence) before a death verdict: the 2-core machines this runs on are loaded.
HEARTBEAT_MISSES = 4
RECONNECT_GRACE_S = 1.0


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
    references: References = field(init=False)
    _etcd: EtcdCluster | None = None
    _owns_etcd: bool = False

    def __post_init__(self) -> None:
        self.references = References(self.workdir / "references")

    def etcd(self) -> EtcdCluster:
        if self._etcd is None:
            if self.etcd_factory is not None:
                self._etcd = self.etcd_factory()
            else:
                from harness.etcd_cluster import tmpfs_root

                self._etcd = EtcdCluster(tmpfs_root())
                self._etcd.start()
                self._owns_etcd = True
        return self._etcd

    def close(self) -> None:
        if self._etcd is not None and self._owns_etcd:
            self._etcd.close()
        self._etcd = None


def spec_for(scenario: Scenario, etcd: EtcdCluster | None) -> ClusterSpec:
    return ClusterSpec(
        nodes=scenario.nodes, spares=scenario.spares, ranks_per_node=1,
        trainer_argv=trainer_base_argv(sys.executable, scenario.steps, scenario.seed) + scenario.trainer_args,
        heartbeat_interval_s=HEARTBEAT_INTERVAL_S, heartbeat_misses=HEARTBEAT_MISSES,
        reconnect_grace_s=RECONNECT_GRACE_S, job_name=f"chaos-{scenario.name}", warm_trainers=1,
        supervisors=scenario.supervisors,
        etcd_endpoints=tuple(etcd.endpoints.split(",")) if etcd is not None else (),
        etcd_prefix=f"/ftsup-chaos/{scenario.name}-{uuid.uuid4().hex[:8]}" if etcd is not None else "",
        agent_args=scenario.agent_args,
    )  # fmt: skip


def run_scenario(scenario: Scenario, ctx: RunContext) -> Result:
    workdir = ctx.workdir / scenario.name
    reason = needs.missing(scenario.needs + (("etcd",) if scenario.uses_etcd else ()))
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
    spec = spec_for(scenario, etcd)
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(spec, workdir))
        cluster.start_supervisor_only()
        proxy = None
        if scenario.proxied_node:
            proxy = stack.enter_context(PartitionProxy(cluster.address))
            cluster.agent_routes[scenario.proxied_node] = proxy.address
        cluster.start_agents()
        chaos = Chaos(cluster, ctx.say, proxy=proxy, etcd=etcd, wait_s=min(120.0, ctx.timeout_s))
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
        try:
            status = cluster.wait_for(
                lambda: (s := chaos.status()) is not None and s.phase == operator_pb2.JOB_PHASE_COMPLETED and s,
                left_s, "the job to complete after the fault",
            )
        except ClusterError as exc:
            return _stuck(scenario, brk, acknowledged, tuple(chaos.records()), exc, workdir)
        records = tuple(cluster.events())
    outcome = Outcome(brk, records, acknowledged, status, spec)
    return judge(scenario, outcome, ctx, workdir)


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
