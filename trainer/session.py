"""The public trainer API: `Session`, the only thing a training script needs to import.

Owns a rank's conversation with its node's agent for one generation: reading the launch
environment, restoring from a snapshot, reporting steps, handing off snapshots and reporting
completion. The training thread only ever pauses to validate arguments and to copy state into
reused host buffers; step reports and snapshot encoding + hand-off run on background threads.
Rules it enforces: step reports reach the agent in the order they were made; at most one
snapshot is in flight (a new one waits for the previous, and the wait is counted); `finish`
reports completion only after every hand-off has been acknowledged.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ftsup.v1 import agent_pb2, peer_pb2
from trainer import snapshot as snap
from trainer.agent_client import AgentClient, AgentLinkError
from trainer.snapshot import SnapshotCorrupt

__all__ = ["AgentLinkError", "LaunchEnv", "Session", "SnapshotCorrupt", "SnapshotStats"]

# Step reports queued beyond this make `report_step` wait for the oldest: bounded memory.
MAX_PENDING_REPORTS = 256


@dataclass(frozen=True, slots=True)
class LaunchEnv:
    """What the agent tells a rank through its environment (torchrun names plus FTSUP_*)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    generation: int
    node_id: str
    agent_address: str
    restore_step: int | None  # None: fresh start

    @classmethod
    def from_mapping(cls, env: Mapping[str, str]) -> LaunchEnv:
        def need(name: str) -> str:
            value = env.get(name, "")
            if value == "":
                raise ValueError(f"environment variable {name} is not set")
            return value

        def need_int(name: str, low: int) -> int:
            raw = need(name)
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
            if value < low:
                raise ValueError(f"{name}={value} must be >= {low}")
            return value

        restore_raw = env.get("FTSUP_RESTORE_STEP", "")
        launch = cls(
            rank=need_int("RANK", 0),
            local_rank=need_int("LOCAL_RANK", 0),
            world_size=need_int("WORLD_SIZE", 1),
            local_world_size=need_int("LOCAL_WORLD_SIZE", 1),
            generation=need_int("FTSUP_GENERATION", 0),
            node_id=need("FTSUP_NODE_ID"),
            agent_address=need("FTSUP_AGENT_ADDRESS"),
            restore_step=None if restore_raw == "" else need_int("FTSUP_RESTORE_STEP", 0),
        )
        if launch.rank >= launch.world_size:
            raise ValueError(f"RANK={launch.rank} must be below WORLD_SIZE={launch.world_size}")
        if launch.local_rank >= launch.local_world_size:
            raise ValueError(
                f"LOCAL_RANK={launch.local_rank} must be below "
                f"LOCAL_WORLD_SIZE={launch.local_world_size}"
            )
        return launch


@dataclass(slots=True)
class SnapshotStats:
    """Counters of the snapshot path, for logs and benchmarks."""

    handed_off: int = 0  # snapshots acknowledged by the agent
    waits: int = 0  # snapshot() calls that had to wait for the previous hand-off
    wait_s: float = 0.0  # total time the training thread spent in those waits
    capture_s: float = 0.0  # total time the training thread spent copying state to host
    last_payload_bytes: int = 0
    host_buffer_bytes: int = 0


class Session:
    """One rank's link to its agent for one generation; see the module docstring."""

    def __init__(self, launch: LaunchEnv, client: AgentClient | None = None) -> None:
        self.launch = launch
        self._client = client if client is not None else AgentClient(launch.agent_address)
        self._reports = ThreadPoolExecutor(1, thread_name_prefix="ftsup-report")
        self._snapshots = ThreadPoolExecutor(1, thread_name_prefix="ftsup-snapshot")
        self._pending_reports: deque[Future[None]] = deque()
        self._inflight: Future[None] | None = None
        self._buffers = snap.HostBuffers()
        self._lock = threading.Lock()
        self._closed = False
        self.stats = SnapshotStats()
        self.restored_extra: Any = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Session:
        """A session for the rank described by `environ` (default: `os.environ`)."""
        return cls(LaunchEnv.from_mapping(os.environ if environ is None else environ))

    # -- identity -------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def local_rank(self) -> int:
        return self.launch.local_rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def generation(self) -> int:
        return self.launch.generation

    @property
    def node_id(self) -> str:
        return self.launch.node_id

    # -- restore ---------------------------------------------------------------------------

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the agent's snapshot into `model`/`optimizer`/RNGs; return the steps done.

        Returns 0 on a fresh start (FTSUP_RESTORE_STEP empty). Otherwise returns S, the step of
        the snapshot, so training continues with step S + 1; `restored_extra` holds the `extra`
        passed to `snapshot`. Call before wrapping the model in DistributedDataParallel or at
        least before the first step.
        """
        self._check_open()
        expected = self.launch.restore_step
        if expected is None:
            return 0
        response = self._client.get_restore(self.rank, self.generation)
        if not response.has_state:
            raise RuntimeError(
                f"agent at {self._client.address!r} has no snapshot for rank {self.rank} "
                f"although FTSUP_RESTORE_STEP={expected}"
            )
        blob = response.blob
        if blob.rank != self.rank or blob.step != expected:
            raise RuntimeError(
                f"agent at {self._client.address!r} returned the snapshot of rank {blob.rank} "
                f"step {blob.step}, expected rank {self.rank} step {expected}"
            )
        state = snap.decode(blob.payload, blob.sha256)
        restored = snap.apply_state(state, _unwrap(model), optimizer)
        if restored.step != expected:
            raise SnapshotCorrupt(
                f"snapshot payload holds step {restored.step}, its blob says step {expected}"
            )
        self.restored_extra = restored.extra
        return restored.step

    # -- per step --------------------------------------------------------------------------

    def report_step(
        self,
        step: int,
        step_time_s: float,
        compute_time_s: float,
        loss: float,
        param_digest: str,
    ) -> None:
        """Queue a StepReport for the agent; returns without waiting for the send.

        Raises ValueError for a negative step or a negative/non-finite time (the loss is
        reported as given, NaN included), and AgentLinkError if an earlier send failed.
        """
        self._check_open()
        _check_step(step)
        _check_duration("step_time_s", step_time_s)
        _check_duration("compute_time_s", compute_time_s)
        report = agent_pb2.StepReport(
            generation=self.generation,
            rank=self.rank,
            step=step,
            step_time_s=float(step_time_s),
            compute_time_s=float(compute_time_s),
            loss=float(loss),
            param_digest=str(param_digest),
        )
        self._raise_report_errors()
        if len(self._pending_reports) >= MAX_PENDING_REPORTS:
            self._pending_reports.popleft().result()
        # One worker thread, FIFO queue: reports reach the agent in the order they were made.
        self._pending_reports.append(self._reports.submit(self._client.report_step, report))

    def snapshot(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: Any = None,
    ) -> None:
        """Hand the state after `step` optimizer steps to the agent, in the background.

        Blocks only to copy the state into reused host buffers, plus, when the previous
        snapshot is still in flight, until it is acknowledged (counted in `stats`). `extra`
        must hold only tensors, numbers, strings, None, dicts, lists and tuples.
        """
        self._check_open()
        _check_step(step)
        self._await_inflight(count_wait=True)
        started = time.monotonic()
        captured = self._buffers.capture(snap.build_state(step, _unwrap(model), optimizer, extra))
        self.stats.capture_s += time.monotonic() - started
        self.stats.host_buffer_bytes = self._buffers.nbytes
        self._inflight = self._snapshots.submit(self._hand_off, step, captured)

    def wait_for_snapshots(self) -> None:
        """Block until the in-flight snapshot (if any) is acknowledged; raise its error."""
        self._await_inflight(count_wait=False)

    def snapshot_barrier(self) -> float:
        """Waits for the previous step's snapshot hand-off; returns the seconds waited.

        Call it in every step before the gradient synchronisation (before `backward()` under
        DDP). No rank can then finish step S+1 before every rank's snapshot of step S is held by
        its node and its buddy, so a failure at any moment loses at most one step. The hand-off
        normally finishes during the forward pass and the wait is zero.
        """
        started = time.monotonic()
        self._await_inflight(count_wait=True)
        return time.monotonic() - started

    def finish(self, step: int, param_digest: str) -> None:
        """Report that this rank completed its last step, after all hand-offs are done."""
        self._check_open()
        _check_step(step)
        self._await_inflight(count_wait=False)
        while self._pending_reports:
            self._pending_reports.popleft().result()
        self._client.report_finished(
            agent_pb2.RankFinished(
                generation=self.generation, rank=self.rank, step=step, param_digest=param_digest
            )
        )

    def close(self) -> None:
        """Stop the background threads (finishing queued work) and close the channel."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._reports.shutdown(wait=True)
        self._snapshots.shutdown(wait=True)
        self._client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _hand_off(self, step: int, captured: Any) -> None:
        payload, sha256 = snap.encode(captured)
        blob = peer_pb2.SnapshotBlob(
            generation=self.generation,
            rank=self.rank,
            step=step,
            owner_node_id=self.node_id,
            payload=payload,
            sha256=sha256,
        )
        self._client.put_snapshot(blob)
        self.stats.last_payload_bytes = len(payload)
        self.stats.handed_off += 1

    def _await_inflight(self, count_wait: bool) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        if count_wait and not inflight.done():
            started = time.monotonic()
            inflight.exception()  # back-pressure: the host buffers are still being encoded
            self.stats.waits += 1
            self.stats.wait_s += time.monotonic() - started
        inflight.result()  # re-raises the hand-off's error, if any

    def _raise_report_errors(self) -> None:
        while self._pending_reports and self._pending_reports[0].done():
            self._pending_reports.popleft().result()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("session is closed")


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    # Snapshots hold the plain module's state dict, so keys never carry DDP's "module." prefix.
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module
    return model


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")


def _check_duration(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
