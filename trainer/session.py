"""The public trainer API: `Session`, the only thing a training script needs to import.

Owns a rank's conversation with its node's agent for one generation: reading the launch
environment, restoring from a snapshot, reporting steps, handing off snapshots and reporting
completion. The training thread only ever pauses to validate arguments and collect the state's
references; the copy into reused host buffers (on GPU a device-to-host copy on a side stream),
the encoding and the hand-off run on a background thread while the next step computes.
Rules it enforces: step reports reach the agent in the order they were made; at most one
snapshot is in flight (a new one waits for the previous, and the wait is counted); the state a
snapshot copies is not changed under it: `optimizer.step()` waits (a step pre-hook) until the
copy has landed, the only place a training loop mutates parameters and optimizer state (code that
mutates them elsewhere calls `wait_for_capture()` first, or sets `background_capture = False`);
`finish` reports completion only after every hand-off has been acknowledged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ftsup.checkpoint.supervised import CheckpointEnv
from ftsup.common.chunks import InvalidSnapshot
from ftsup.trainer import liveness
from ftsup.trainer import snapshot as snap
from ftsup.trainer import state as state_module
from ftsup.trainer.agent_client import AgentClient, AgentLinkError
from ftsup.trainer.snapshot import SnapshotCorrupt
from ftsup.trainer.state import StateError
from ftsup.v1 import agent_pb2, peer_pb2

__all__ = ["AgentLinkError", "LaunchEnv", "Session", "SnapshotCorrupt", "SnapshotStats", "StateError"]

# Step reports queued beyond this make `report_step` wait for the oldest: bounded memory.
MAX_PENDING_REPORTS = 256
REJOIN_DRAIN_S = 5.0  # how long a rejoining rank waits for the old generation's sends to settle
WATCH_DEADLINE_S = 3600.0  # one WatchGeneration call; asked again after it


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
    # An elastic job's full world (FTSUP_FULL_WORLD_SIZE); None: not elastic, the world is full.
    full_world_size: int | None = None

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
            full_world_size=need_int("FTSUP_FULL_WORLD_SIZE", 1) if env.get("FTSUP_FULL_WORLD_SIZE") else None,
        )
        full = launch.full_world_size
        if full is not None and (full < launch.world_size or full % launch.world_size):
            raise ValueError(f"FTSUP_FULL_WORLD_SIZE={full} must be a multiple of WORLD_SIZE={launch.world_size}")
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
    capture_s: float = 0.0  # total time the training thread spent in snapshot() collecting/copying state
    capture_waits: int = 0  # optimizer steps that had to wait for a background copy to land
    capture_wait_s: float = 0.0  # total time those optimizer steps waited
    last_copy_s: float = 0.0  # the last snapshot's copy into host buffers, wherever it ran
    last_held_s: float = 0.0  # the last snapshot: from the snapshot() call to the agent's ack
    last_payload_bytes: int = 0
    host_buffer_bytes: int = 0


class Session:
    """One rank's link to its agent for one generation; see the module docstring."""

    def __init__(
        self, launch: LaunchEnv, client: AgentClient | None = None, background_capture: bool = True,
        checkpoints: CheckpointEnv | None = None,
    ) -> None:
        self.launch = launch
        # Object-store checkpoints (FTSUP_CHECKPOINT_*): off when no location is configured.
        self.checkpoints = checkpoints if checkpoints is not None else CheckpointEnv("", 0, "", "", "")
        self._checkpoint_store: Any = None  # (store, layout), opened on first use
        # False: snapshot() copies on the training thread (for loops that mutate state outside
        # optimizer.step()); True: the copy runs in the background, guarded by a step pre-hook.
        self.background_capture = background_capture
        self._client = client if client is not None else AgentClient(launch.agent_address)
        self._reports = ThreadPoolExecutor(1, thread_name_prefix="ftsup-report")
        self._snapshots = ThreadPoolExecutor(1, thread_name_prefix="ftsup-snapshot")
        self._pending_reports: deque[Future[None]] = deque()
        self._inflight: Future[None] | None = None
        self._buffers = snap.HostBuffers()
        self._copied: threading.Event | None = None  # set once the in-flight copy has landed
        self._guarded: list[tuple[torch.optim.Optimizer, Any]] = []  # (optimizer, hook handle)
        self._side_stream: Any = None  # CUDA stream for device-to-host copies, made on first use
        self._lock = threading.Lock()
        self._requested_steps: set[int] = set()  # checkpoints asked for off the cadence (from step acks)
        self.rejoins = 0  # generations joined in-process (the fast path), for logs and tests
        self._on_replaced: Callable[[], None] | None = None
        self._finished = False
        self._closed = False
        self.stats = SnapshotStats()
        self.restored_extra: Any = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, background_capture: bool = True) -> Session:
        """A session for the rank described by `environ` (default: `os.environ`). Launched without
        ftsup (plain torchrun or python: no FTSUP_AGENT_ADDRESS), a no-op session with one warning,
        so one script runs everywhere."""
        env = os.environ if environ is None else environ
        if not env.get("FTSUP_AGENT_ADDRESS"):
            from ftsup.trainer.offline import unsupervised_session  # offline imports this module
            return unsupervised_session(env)
        return cls(LaunchEnv.from_mapping(env), background_capture=background_capture,
                   checkpoints=CheckpointEnv.from_mapping(env))

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
    def accumulation(self) -> int:
        """Micro-batches per step for this rank: full world / world (1 unless an elastic job runs
        shrunk). Summing them keeps the global batch, so the optimizer sees the same step."""
        full = self.launch.full_world_size
        return 1 if full is None else full // self.launch.world_size

    @property
    def data_ranks(self) -> range:
        """The full-world ranks whose data this rank consumes, one per micro-batch: rank r of a
        world shrunk by A takes ranks r*A .. r*A + A - 1, so the union is the full world's batch."""
        a = self.accumulation
        return range(self.rank * a, self.rank * a + a)

    @property
    def generation(self) -> int:
        return self.launch.generation

    @property
    def node_id(self) -> str:
        return self.launch.node_id

    # -- restore ---------------------------------------------------------------------------

    def restore(self, model_or_state: Any, optimizer: torch.optim.Optimizer | None = None) -> int:
        """Load the agent's snapshot into the state (a mapping of names to modules, optimizers and
        `Stateful` objects, as given to `snapshot`, or `(model, optimizer)`) and the RNGs; return
        the steps done. The ladder: the agent's RAM copy, else the object-store checkpoint the
        supervisor named (resharded when the world changed; docs/state.md).

        Returns 0 on a fresh start (FTSUP_RESTORE_STEP empty). Otherwise returns S, the step of
        the snapshot, so training continues with step S + 1; `restored_extra` holds the `extra`
        passed to `snapshot`. Call before wrapping the model in DistributedDataParallel or at
        least before the first step.
        """
        self._check_open()
        objects = state_module.objects_of(model_or_state, optimizer)
        expected = self.launch.restore_step
        if expected is None:
            return 0
        try:
            held = self._client.get_restore(self.rank, self.generation)
        except InvalidSnapshot as exc:
            raise SnapshotCorrupt(f"restore from agent at {self._client.address!r}: {exc}") from exc
        if held is None and self.checkpoints.restore_checkpoint_id:
            # The agent holds no RAM copy for this rank: the supervisor chose the object store.
            return self._restore_checkpoint(expected, objects)
        if held is None:
            raise RuntimeError(
                f"agent at {self._client.address!r} has no snapshot for rank {self.rank} "
                f"although FTSUP_RESTORE_STEP={expected}"
            )
        # An elastic job's ranks hold the same state: after a resize a rank may get another's copy.
        other_rank_ok = self.launch.full_world_size is not None
        if (held.rank != self.rank and not other_rank_ok) or held.step != expected:
            raise RuntimeError(
                f"agent at {self._client.address!r} returned the snapshot of rank {held.rank} "
                f"step {held.step}, expected rank {self.rank} step {expected}"
            )
        state = snap.load(held.payload)  # its SHA-256 was checked while it streamed in
        restored = snap.apply_objects(state, objects)
        if restored.step != expected:
            raise SnapshotCorrupt(
                f"snapshot payload holds step {restored.step}, its blob says step {expected}"
            )
        self.restored_extra = restored.extra
        return restored.step

    def _restore_checkpoint(self, expected: int, objects: dict[str, Any]) -> int:
        """The third rung of the recovery ladder: this rank's state from the committed object-store
        checkpoint the supervisor named (FTSUP_RESTORE_CHECKPOINT). Per rank, not collective:
        ranks whose RAM copies survived restore from RAM at the same step meanwhile."""
        from ftsup.checkpoint import supervised
        from ftsup.trainer import sharded_checkpoint

        checkpoint_id = self.checkpoints.restore_checkpoint_id
        store, layout = self._open_checkpoint_store()
        manifest_sha256 = self.checkpoints.restore_manifest_sha256
        if supervised.is_sharded(store, layout, checkpoint_id, manifest_sha256=manifest_sha256):
            restored = sharded_checkpoint.load(store, layout, checkpoint_id, self.rank, self.world_size, objects,
                                               manifest_sha256=manifest_sha256)
        else:  # a per-rank checkpoint of an earlier version: same world size only
            payload, sha256 = supervised.load_rank(store, layout, checkpoint_id, self.rank, self.world_size,
                                                   replicated=self.launch.full_world_size is not None,
                                                   manifest_sha256=manifest_sha256)
            restored = snap.apply_objects(snap.decode(payload, sha256), objects)
        if restored.step != expected:
            raise SnapshotCorrupt(
                f"checkpoint {checkpoint_id!r} holds step {restored.step}, FTSUP_RESTORE_STEP={expected}"
            )
        self.restored_extra = restored.extra
        return restored.step

    # -- object-store checkpoints ------------------------------------------------------------

    def checkpoint_due(self, step: int) -> bool:
        """Is `step` a checkpoint step? Call it on every rank after every step (collective when a
        checkpoint store is configured and the world has more than one rank).

        Two sources: the cadence (FTSUP_CHECKPOINT_EVERY_STEPS, the same rule as the
        supervisor's, known everywhere without asking) and steps requested off the cadence
        (`supervisorctl checkpoint now`, the supervisor's `auto` interval), which reach each rank
        with its agent's answers to step reports. Ranks may hear of a request a step apart, and
        saving is collective, so they agree with one all-reduce (MIN) of the next requested step
        each knows: if any rank heard of it in time, all save at it; if none did, none does (the
        supervisor then withdraws the request)."""
        from ftsup.checkpoint.supervised import is_due

        if not self.checkpoints.location:
            return False
        with self._lock:
            self._requested_steps = {s for s in self._requested_steps if s >= step}
            known = min(self._requested_steps, default=_NO_REQUEST)
        agreed = _agree_on_min(known)
        return is_due(step, self.checkpoints.every_steps) or agreed == step

    def _send_step_report(self, report: agent_pb2.StepReport) -> None:
        ack = self._client.report_step(report)
        steps = list(getattr(ack, "checkpoint_steps", ()) or ())
        if steps:
            with self._lock:
                self._requested_steps.update(s for s in steps if s > report.step)

    def save_checkpoint(self, step: int, model_or_state: Any, optimizer: torch.optim.Optimizer | None = None,
                        extra: Any = None) -> None:
        """Collective: write this rank's shards of the checkpoint of `step` to the object store (through
        DCP: modules and optimizers sharded as they live, restorable at another world size) and
        report it to the agent (the supervisor commits once every rank has). Synchronous: the
        training thread pauses for the encode and the upload. A failed write is reported (the
        supervisor aborts the attempt) and not raised: training goes on without this checkpoint."""
        from ftsup.checkpoint import supervised
        from ftsup.trainer import sharded_checkpoint

        self._check_open()
        _check_step(step)
        objects = state_module.objects_of(model_or_state, optimizer)
        state_module.validate(extra, "extra")
        checkpoint_id = supervised.checkpoint_id_for(step, self.generation)
        self.wait_for_capture()
        shard = agent_pb2.CheckpointShard(generation=self.generation, rank=self.rank,
                                          checkpoint_id=checkpoint_id, step=step)
        try:
            store, layout = self._open_checkpoint_store()
            report = sharded_checkpoint.save(store, layout, checkpoint_id, self.rank, step, objects, extra)
            shard.key, shard.sha256, shard.size_bytes = report.key, report.sha256, report.size_bytes
        except Exception as exc:
            shard.error = f"{type(exc).__name__}: {exc}"[:2000]
        self._raise_report_errors()
        # Same FIFO as step reports: the supervisor sees this rank's step report first.
        self._pending_reports.append(self._reports.submit(self._client.report_checkpoint_shard, shard))

    def _open_checkpoint_store(self) -> Any:
        if self._checkpoint_store is None:
            self._checkpoint_store = self.checkpoints.open()
        return self._checkpoint_store

    # -- per step --------------------------------------------------------------------------

    def report_step(
        self,
        step: int,
        step_time_s: float,
        compute_time_s: float,
        loss: float,
        param_digest: str,
        grad_norm: float | None = None,
        tokens: int = 0,
        local_grad_digest: str = "",
        replica_group: int | None = None,
    ) -> None:
        """Queue a StepReport for the agent; returns without waiting for the send.

        `grad_norm` and `tokens` (this rank's tokens in the step) feed the supervisor's metrics
        (gradient norm, tokens/s, MFU); leave them out when unknown. `local_grad_digest` (a
        `trainer.digest.GradDigester` of this rank's gradients before the all-reduce) lets the
        supervisor's SDC recompute check replay this step elsewhere and compare. `replica_group`
        (`trainer.replicas.replica_group(model, rank, world).id`) names the ranks this rank's
        digest is compared with; left out, the supervisor's configured layout decides.
        Raises ValueError for a negative step, a negative/non-finite time, a negative norm or
        token count (the loss and the norm are reported as given, NaN included), and
        AgentLinkError if an earlier send failed.
        """
        self._check_open()
        _check_step(step)
        _check_duration("step_time_s", step_time_s)
        _check_duration("compute_time_s", compute_time_s)
        if grad_norm is not None and grad_norm < 0:
            raise ValueError(f"grad_norm must not be negative, got {grad_norm!r}")
        if tokens < 0:
            raise ValueError(f"tokens must not be negative, got {tokens!r}")
        report = agent_pb2.StepReport(
            generation=self.generation,
            rank=self.rank,
            step=step,
            step_time_s=float(step_time_s),
            compute_time_s=float(compute_time_s),
            loss=float(loss),
            param_digest=str(param_digest),
            grad_norm=None if grad_norm is None else float(grad_norm),
            tokens=int(tokens),
            local_grad_digest=str(local_grad_digest),
            replica_group=None if replica_group is None else int(replica_group),
        )
        self._raise_report_errors()
        if len(self._pending_reports) >= MAX_PENDING_REPORTS:
            self._pending_reports.popleft().result()
        # One worker thread, FIFO queue: reports reach the agent in the order they were made.
        self._pending_reports.append(self._reports.submit(self._send_step_report, report))

    def snapshot(
        self,
        step: int,
        model_or_state: Any,
        optimizer: torch.optim.Optimizer | None = None,
        extra: Any = None,
    ) -> None:
        """Hand the state after `step` optimizer steps to the agent, in the background.

        The state is a mapping of names to modules (plain, DDP, FSDP2, TP), optimizers and
        `Stateful` objects (schedulers, GradScaler, StatefulDataLoader), or `(model, optimizer)`;
        sharded tensors are captured as this rank's local shards (docs/state.md). A value a restore
        could not load (numpy, custom classes, functions) raises StateError here, naming its key.

        Blocks only to collect the state's tensors (with `background_capture` False: to copy
        them into reused host buffers), plus, when the previous snapshot is still in flight,
        until it is acknowledged (counted in `stats`). The next `optimizer.step()` waits until
        the background copy has landed. `extra` must hold only tensors, numbers, strings, None,
        dicts, lists and tuples, and must not be changed until `wait_for_capture()`.
        """
        self._check_open()
        _check_step(step)
        objects = state_module.objects_of(model_or_state, optimizer)
        state_module.validate(extra, "extra")
        self._await_inflight(count_wait=True)
        started = time.monotonic()
        state = snap.build_objects_state(step, state_module.collect(objects), extra)
        if not self.background_capture:
            captured = self._buffers.capture(state)
            self.stats.last_copy_s = time.monotonic() - started
            self.stats.capture_s += self.stats.last_copy_s
            self.stats.host_buffer_bytes = self._buffers.nbytes
            self._inflight = self._snapshots.submit(self._hand_off, step, captured, started)
            return
        for each in state_module.optimizers(objects):
            self._guard(each)
        copied = threading.Event()
        self._copied = copied
        # The copy must see the state as of now: on GPU the side stream waits for this point of
        # the training stream; on CPU nothing changes it before optimizer.step() (guarded).
        ready = _record_ready_event(state_module.first_module(objects))
        self._inflight = self._snapshots.submit(self._capture_and_hand_off, step, state, copied, ready, started)
        self.stats.capture_s += time.monotonic() - started

    def wait_for_capture(self) -> float:
        """Blocks until the in-flight snapshot's copy has landed; returns the seconds waited.

        Call it before changing parameters or optimizer state other than by `optimizer.step()`
        (which calls it itself) while a snapshot may be in flight.
        """
        copied = self._copied
        if copied is None or copied.is_set():
            return 0.0
        started = time.monotonic()
        copied.wait()
        waited = time.monotonic() - started
        self.stats.capture_waits += 1
        self.stats.capture_wait_s += waited
        return waited

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

    def on_generation_replaced(self, callback: Callable[[], None]) -> None:
        """Calls `callback` (from a background thread) once the agent replaces the generation
        this rank runs, again after each rejoin; never after `finish`. The fast path passes a
        process-group abort: a rank blocked in a collective on a dead peer gets out at once."""
        self._on_replaced = callback
        self._start_watch()

    def _start_watch(self) -> None:
        if self._on_replaced is None:
            return
        generation, rank = self.generation, self.rank

        def watch() -> None:
            while not self._closed and not self._finished and self.generation == generation:
                try:
                    self._client.watch_generation(generation, rank, WATCH_DEADLINE_S)
                except AgentLinkError:
                    if self._closed:
                        return
                    time.sleep(0.5)  # the agent restarting, or the deadline: ask again
                    continue
                if not self._finished and self.generation == generation and self._on_replaced is not None:
                    self._on_replaced()
                return

        threading.Thread(target=watch, name="ftsup-generation-watch", daemon=True).start()

    def rejoin(self, wait_s: float = 120.0) -> bool:
        """The in-process fast path, after this rank's process group broke (a peer died): drop
        what was in flight for the old generation, ask the agent for the next generation, and
        take on its rank's environment (os.environ, `launch`, the restore step). True: re-init the
        process group with the new rank and world, then `restore()` as at start. False: no
        generation for this process (exit; the agent restarts the rank as before)."""
        self._check_open()
        old_generation, old_rank = self.generation, self.rank
        # Reports and the hand-off of the broken generation: sent or not, they no longer matter
        # (the agent refuses the old generation's messages once the new one starts).
        for pending in list(self._pending_reports):
            try:
                pending.result(timeout=REJOIN_DRAIN_S)
            except Exception:
                pass
        self._pending_reports.clear()
        inflight = self._inflight
        if inflight is not None:
            try:
                inflight.result(timeout=REJOIN_DRAIN_S)
            except Exception:
                pass
            self._inflight = None
        try:
            answer = self._client.await_generation(old_generation, old_rank, wait_s)
        except AgentLinkError:
            return False
        if not answer.assigned:
            return False
        env = {e.name: e.value for e in answer.env}
        os.environ.update(env)
        self.launch = LaunchEnv.from_mapping(os.environ)
        fresh = CheckpointEnv.from_mapping(os.environ)
        self.checkpoints = dataclasses.replace(fresh, read_timeout_s=self.checkpoints.read_timeout_s,
                                               retry_deadline_s=self.checkpoints.retry_deadline_s)
        with self._lock:
            self._requested_steps.clear()
        self.rejoins += 1
        self._start_watch()
        return True

    def finish(self, step: int, param_digest: str) -> None:
        """Report that this rank completed its last step, after all hand-offs are done."""
        self._check_open()
        _check_step(step)
        self._finished = True  # the generation ending now (job complete) must not abort the group
        self._await_inflight(count_wait=False)
        while self._pending_reports:
            self._pending_reports.popleft().result()
        self._client.report_finished(
            agent_pb2.RankFinished(
                generation=self.generation, rank=self.rank, step=step, param_digest=param_digest
            )
        )

    # -- liveness (level 1): trainer/liveness.py ------------------------------------------------

    def heartbeat(self) -> None:
        """Alive between steps: the agent's hang watcher counts it as progress."""
        self._liveness().heartbeat()

    def phase(self, name: str, timeout_s: float = 0.0) -> contextlib.AbstractContextManager[None]:
        """`with session.phase("eval", timeout_s=1800): ...`: a named stretch with its own hang limit."""
        return self._liveness().phase(name, timeout_s)

    def _liveness(self) -> liveness.Liveness:
        if getattr(self, "_liveness_state", None) is None:
            self._liveness_state = liveness.Liveness(self._client.report_liveness,
                                                     lambda: (self.launch.generation, self.launch.rank))
        return self._liveness_state

    def close(self) -> None:
        """Stop the background threads (finishing queued work) and close the channel."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._reports.shutdown(wait=True)
        self._snapshots.shutdown(wait=True)
        for _optimizer, handle in self._guarded:
            handle.remove()
        self._guarded.clear()
        self._client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _guard(self, optimizer: torch.optim.Optimizer) -> None:
        """Makes `optimizer.step()` wait for the in-flight copy (registered once per optimizer)."""
        if any(known is optimizer for known, _ in self._guarded):
            return
        def before_step(_optimizer: object, _args: object, _kwargs: object) -> None:
            self.wait_for_capture()  # a pre-hook must return None (or new arguments)

        self._guarded.append((optimizer, optimizer.register_step_pre_hook(before_step)))

    def _capture_and_hand_off(
        self, step: int, state: Any, copied: threading.Event, ready: Any, started: float
    ) -> None:
        try:
            copy_started = time.monotonic()
            if ready is not None:
                if self._side_stream is None:
                    self._side_stream = torch.cuda.Stream(device=ready.device)
                with torch.cuda.stream(self._side_stream):
                    self._side_stream.wait_event(ready.event)
                    captured = self._buffers.capture(state)
            else:
                captured = self._buffers.capture(state)
            self.stats.last_copy_s = time.monotonic() - copy_started
            self.stats.host_buffer_bytes = self._buffers.nbytes
        finally:
            copied.set()  # on failure too: the error surfaces through the future, never a hang
        del state  # the live references: only the host copy travels on
        self._hand_off(step, captured, started)

    def _hand_off(self, step: int, captured: Any, started: float) -> None:
        payload = snap.serialize(captured)
        header = peer_pb2.SnapshotHeader(
            generation=self.generation, rank=self.rank, step=step, owner_node_id=self.node_id
        )
        # Streamed in chunks, hashed as they go out; returns once the agent and its buddy hold it.
        self._client.put_snapshot(header, payload)
        self.stats.last_held_s = time.monotonic() - started
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


_NO_REQUEST = (1 << 62)  # "no requested step known": larger than any step, exact in an int64


def _agree_on_min(value: int) -> int:
    """The smallest `value` over the default process group (the value itself outside one)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


@dataclass(frozen=True, slots=True)
class _Ready:
    device: torch.device
    event: Any  # torch.cuda.Event recorded on the training stream


def _record_ready_event(model: torch.nn.Module | None) -> _Ready | None:
    """A CUDA event at the current point of the training stream, or None for a CPU model."""
    first = None if model is None else next(iter(model.parameters()), None)
    if first is None or not first.is_cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(first.device))
    return _Ready(first.device, event)


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")


def _check_duration(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
