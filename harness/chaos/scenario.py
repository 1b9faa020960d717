"""What a chaos scenario is: a cluster shape, one way to break it, and the outcome it expects.

A scenario never starts or stops processes itself: the runner (harness/chaos/runner.py) builds
the cluster from the scenario's shape, hands `break_it` a `Chaos` (the live cluster plus the
proxy, etcd and checkpoint store it asked for) and, once the job finished, hands `expect` the
`Outcome` (the final event log, what was acknowledged before the fault and, when the job
checkpointed, what the store holds). The generic invariants (job completed, nothing acknowledged
lost, gapless, checkpoints in the log and in the store, bitwise match) are the runner's, not each
scenario's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ftsup.checkpoint.manifest import Layout
from ftsup.checkpoint.store import ObjectStore
from ftsup.harness.chaos.proxy import PartitionProxy
from ftsup.harness.chaos.s3_proxy import FaultProxy
from ftsup.harness.chaos.store_checks import StoreView
from ftsup.harness.cluster import ClusterSpec, LocalCluster
from ftsup.harness.etcd_cluster import EtcdCluster
from ftsup.v1 import events_pb2, operator_pb2


@dataclass(frozen=True, slots=True)
class Break:
    """When (wall clock, as the event log's timestamps) and where the fault hit."""

    at: float
    step: int  # the last step the job had completed when it hit
    node: str = ""
    detail: str = ""
    problems: tuple[str, ...] = ()  # what went wrong while breaking it (a fault that never fired)


@dataclass(frozen=True, slots=True)
class Outcome:
    brk: Break
    records: tuple[events_pb2.Record, ...]
    acknowledged: tuple[events_pb2.Record, ...]
    status: operator_pb2.GetStatusResponse
    spec: ClusterSpec
    store: StoreView | None = None  # the checkpoint store at the end, when the job checkpointed


@dataclass(frozen=True)
class CheckpointStore:
    """The job's checkpoint store: where the cluster writes (`location`, through `faults` when set)
    and a direct handle on it for the harness's own checks (never through the fault proxy)."""

    location: str
    layout: Layout
    store: ObjectStore
    faults: FaultProxy | None = None  # S3 only: the proxy every S3 request of the job goes through


@dataclass
class Chaos:
    """The live cluster as a scenario sees it while breaking it."""

    cluster: LocalCluster
    say: Callable[[str], None]
    proxy: PartitionProxy | None = None
    etcd: EtcdCluster | None = None
    wait_s: float = 120.0
    checkpoints: CheckpointStore | None = None

    def status(self) -> operator_pb2.GetStatusResponse | None:
        """The cluster status, or None while no replica answers (a failover, no etcd quorum)."""
        try:
            return self.cluster.status()
        except grpc.RpcError:
            return None

    def step(self) -> int:
        status = self.status()
        return status.step if status is not None else 0

    def generation(self) -> int:
        status = self.status()
        return status.generation if status is not None else 0

    def records(self) -> list[events_pb2.Record]:
        try:
            return self.cluster.events()
        except grpc.RpcError:
            return []

    def wait_record(self, name: str, since: float, match: Callable[[Any], bool] = lambda _body: True,
                    timeout_s: float | None = None) -> events_pb2.Record:
        """Waits for a record of kind `name` stamped at or after `since` whose body satisfies `match`."""

        def found() -> events_pb2.Record | None:
            for record in self.records():
                if (record.time_unix_s >= since and record.event.WhichOneof("kind") == name
                        and match(getattr(record.event, name))):
                    return record
            return None

        return self.cluster.wait_for(found, timeout_s or self.wait_s, f"a {name} event", poll_s=0.1)

    def wait_checkpoint_outcome(self, checkpoint_id: str, timeout_s: float | None = None) -> events_pb2.Record:
        """The CheckpointCommitted or CheckpointAborted record of `checkpoint_id`, once there is one."""

        def found() -> events_pb2.Record | None:
            for record in self.records():
                name = record.event.WhichOneof("kind")
                if name in ("checkpoint_committed", "checkpoint_aborted") and getattr(
                        record.event, name).checkpoint_id == checkpoint_id:
                    return record
            return None

        return self.cluster.wait_for(found, timeout_s or self.wait_s, f"the outcome of checkpoint {checkpoint_id}",
                                     poll_s=0.1)

    def wait_step(self, step: int, timeout_s: float | None = None) -> int:
        return self.cluster.wait_for(lambda: (s := self.step()) >= step and s, timeout_s or self.wait_s,
                                     f"step {step}")


@dataclass(frozen=True, slots=True)
class Scenario:
    """One failure kind. `needs` names capabilities checked at run time (harness/chaos/needs.py):
    a scenario whose needs are missing is reported as skipped with the reason, never as passed."""

    name: str
    description: str
    break_it: Callable[[Chaos], Break]
    expect: Callable[[Outcome], list[str]]  # scenario-specific problems; [] when all is as expected
    verdicts: tuple[str, ...]  # event kinds that count as "detected" (the first one after the break)
    nodes: int = 3
    spares: int = 1
    supervisors: int = 1  # > 1: replicas on etcd
    uses_etcd: bool = False
    steps: int = 14
    break_at_step: int = 4  # the runner waits for this step before calling break_it
    trainer_args: tuple[str, ...] = ()
    agent_args: tuple[str, ...] = ()
    proxied_node: str = ""  # this node's agent dials the supervisor through a PartitionProxy
    checkpoint_every_steps: int = 0  # > 0: object-store checkpoints (to a directory unless uses_s3)
    checkpoint_keep: int = 2
    uses_s3: bool = False  # checkpoints to a real S3 server, every request through a FaultProxy
    # Called once the supervisor is up, before any agent starts: arm faults that must be in place
    # before the first step (e.g. S3 fault rules for a checkpoint a few steps in).
    prepare: Callable[[Chaos], None] | None = None
    needs: tuple[str, ...] = ()
    same_world: bool = True  # the world size survives: the final digest must match the reference
    seed: int = 7
    # Known ftsup gaps this scenario exposes: reported under "gaps" when they show, never failing
    # the scenario (each is written up in docs/chaos.md until it is fixed).
    gaps: Callable[[Outcome], list[str]] = lambda _o: []

    def __post_init__(self) -> None:
        if self.supervisors > 1 and not self.uses_etcd:
            raise ValueError(f"scenario {self.name!r}: {self.supervisors} supervisor replicas need etcd")
        if not 1 <= self.break_at_step < self.steps:
            raise ValueError(f"scenario {self.name!r}: break_at_step {self.break_at_step} not in [1, {self.steps})")
        if self.uses_s3 and self.checkpoint_every_steps < 1:
            raise ValueError(f"scenario {self.name!r}: uses_s3 needs checkpoint_every_steps >= 1")


