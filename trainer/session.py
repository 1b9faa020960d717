"""The public trainer API: `Session`, the only thing a training script needs to import.

Owns a rank's conversation with its node's agent for one generation, as a facade over the parts
that each own one thing: the launch environment (launch.py), restoring (restore.py, and
checkpoints.py for the object-store rung), step reports in order (reports.py), snapshots in
flight (handoff.py), when to snapshot (schedule.py over trainer/core/cadence.py), checkpoints
(checkpoints.py), the generation watch (generation_watch.py) and liveness (liveness.py). The
training thread only ever pauses to validate arguments and collect the state's references; the
copy, the encoding and the hand-off run in the background while the next step computes.
`finish` reports completion only after every hand-off has been acknowledged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc
import torch

from ftsup.checkpoint.supervised import CheckpointEnv
from ftsup.common import rendezvous_store
from ftsup.trainer import generation_watch, liveness, restore
from ftsup.trainer import state as state_module
from ftsup.trainer.agent_client import AgentClient, AgentLinkError
from ftsup.trainer.checkpoints import Checkpoints
from ftsup.trainer.handoff import Handoff, SnapshotStats
from ftsup.trainer.launch import LaunchEnv
from ftsup.trainer.reports import ReportQueue, StepWindow, check_duration, check_step, window_from_mapping
from ftsup.trainer.schedule import Schedule, config_from_mapping
from ftsup.trainer.snapshot import SnapshotCorrupt
from ftsup.trainer.state import StateError
from ftsup.v1 import agent_pb2, peer_pb2

__all__ = ["AgentLinkError", "LaunchEnv", "Session", "SnapshotCorrupt", "SnapshotStats", "StateError"]

REJOIN_DRAIN_S = 5.0  # how long a rejoining rank waits for the old generation's sends to settle


class Session:
    """One rank's link to its agent for one generation; see the module docstring."""

    def __init__(
        self, launch: LaunchEnv, client: AgentClient | None = None, background_capture: bool = True,
        checkpoints: CheckpointEnv | None = None, schedule: Schedule | None = None,
        report_window_s: float = 0.0,
    ) -> None:
        self.launch = launch
        # False: snapshot() copies on the training thread (for loops that mutate state outside
        # optimizer.step()); True: the copy runs in the background, guarded by a step pre-hook.
        self.background_capture = background_capture
        self._client = client if client is not None else AgentClient(launch.agent_address)
        # Object-store checkpoints (FTSUP_CHECKPOINT_*): off when no location is configured.
        self._checkpoints = Checkpoints(checkpoints if checkpoints is not None else CheckpointEnv("", 0, "", "", ""))
        self._reports = ReportQueue()
        # Step reports within `report_window_s` of the last send go together (trainer/reports.py;
        # FTSUP_STEP_REPORT_WINDOW_S under an agent); 0: each at once.
        self._steps = StepWindow(self._reports, self._send_step_reports, report_window_s)
        self._batched_reports = True  # False once the agent answered ReportSteps UNIMPLEMENTED (older)
        self._handoff = Handoff(self._client, self._snapshot_header)
        # Auto cadence unless told otherwise (FTSUP_SNAPSHOT_*); used by trainers that ask snapshot_due().
        self.schedule = schedule if schedule is not None else Schedule(config_from_mapping({}))
        self._lock = threading.Lock()
        self.rejoins = 0  # generations joined in-process (the fast path), for logs and tests
        self._on_replaced: Callable[[], None] | None = None
        self._liveness_state: liveness.Liveness | None = None
        self._finished = False
        self._closed = False
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
                   checkpoints=CheckpointEnv.from_mapping(env), schedule=Schedule(config_from_mapping(env)),
                   report_window_s=window_from_mapping(env))

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
        return self.launch.accumulation

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

    @property
    def checkpoints(self) -> CheckpointEnv:
        """The object-store checkpoint settings (FTSUP_CHECKPOINT_*); assign to change the trainer's own."""
        return self._checkpoints.env

    @checkpoints.setter
    def checkpoints(self, env: CheckpointEnv) -> None:
        self._checkpoints = Checkpoints(env)

    @property
    def stats(self) -> SnapshotStats:
        return self._handoff.stats

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
            self.schedule.restart(0)
            return 0
        held = restore.fetch(self._client, self.rank, self.generation)
        if held is None and self.checkpoints.restore_checkpoint_id:
            # The agent holds no RAM copy for this rank: the supervisor chose the object store.
            restored = self._checkpoints.restore(expected, self.rank, self.world_size, objects,
                                                 replicated=self.launch.full_world_size is not None)
        else:
            # An elastic job's ranks hold the same state: after a resize a rank may get another's copy.
            restored = restore.apply_held(held, self._client.address, self.rank, expected,
                                          any_rank=self.launch.full_world_size is not None, objects=objects)
        self.restored_extra = restored.extra
        self.schedule.restart(restored.step)
        self.schedule.snapshotted_step = restored.step  # held by the agents: a recompute of the next step replays it
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
        return self._checkpoints.is_due(step)

    def save_checkpoint(self, step: int, model_or_state: Any, optimizer: torch.optim.Optimizer | None = None,
                        extra: Any = None) -> None:
        """Collective: write this rank's shards of the checkpoint of `step` to the object store (through
        DCP: modules and optimizers sharded as they live, restorable at another world size) and
        report it to the agent (the supervisor commits once every rank has). Synchronous: the
        training thread pauses for the encode and the upload. A failed write is reported (the
        supervisor aborts the attempt) and not raised: training goes on without this checkpoint.
        Call it before reporting a later step: the supervisor takes a rank's report of a later step
        without its shard as a rank that did not save, and aborts the attempt at once."""
        self._check_open()
        check_step(step)
        objects = state_module.objects_of(model_or_state, optimizer)
        state_module.validate(extra, "extra")
        self.wait_for_capture()
        shard = self._checkpoints.save(self.generation, self.rank, step, objects, extra)
        # Same FIFO as step reports, whose window is flushed first: the supervisor sees this
        # rank's step report first.
        self._steps.flush()
        self._reports.submit(self._client.report_checkpoint_shard, shard)

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
        """Queue a StepReport for the agent; returns without waiting for the send. Under an agent,
        reports made within FTSUP_STEP_REPORT_WINDOW_S (default 0: off) of the last send go in one
        call once that window has passed (trainer/reports.py); a slower step's report goes at once.

        `grad_norm` and `tokens` (this rank's tokens in the step) feed the supervisor's metrics
        (gradient norm, tokens/s, MFU); leave them out when unknown. `local_grad_digest` (a
        `trainer.digest.GradDigester` of this rank's gradients before the all-reduce) lets the
        supervisor's SDC recompute check replay this step elsewhere and compare; it is only
        usable for a step right after a snapshot (`wants_grad_digest`). `replica_group`
        (`trainer.replicas.replica_group(model, rank, world).id`) names the ranks this rank's
        digest is compared with; left out, the supervisor's configured layout decides.
        Raises ValueError for a negative step, a negative/non-finite time, a negative norm or
        token count (the loss and the norm are reported as given, NaN included), and
        AgentLinkError if an earlier send failed.
        """
        self._check_open()
        check_step(step)
        check_duration("step_time_s", step_time_s)
        check_duration("compute_time_s", compute_time_s)
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
        # One worker thread, FIFO queue: reports reach the agent in the order they were made, those
        # of one window in one call.
        self._steps.add(report)

    def snapshot_due(self, step: int) -> bool:
        """Is `step` a snapshot step? Call it on every rank after every step, then `snapshot` when
        True. Fixed (FTSUP_SNAPSHOT_EVERY_STEPS=k; 1 = every step) or, by default, auto: every k
        steps with k chosen so that about FTSUP_SNAPSHOT_INTERVAL_S (default 1 s) of training lies
        between snapshots, and k = 1 when a step takes longer. A failure loses at most k steps.
        Auto is collective at snapshot steps only (one all-reduce agrees on the next k, so every
        rank snapshots the same steps); a fixed cadence never is. docs/state.md."""
        self._check_open()
        check_step(step)
        return self.schedule.is_due(step)

    @property
    def snapshot_every(self) -> int:
        """The current cadence k: a failure now loses at most this many steps."""
        return self.schedule.every

    def wants_grad_digest(self, step: int) -> bool:
        """Does a local-gradient digest of `step` serve anything? Only when this rank snapshotted
        `step - 1`: an SDC recompute replays a step from the snapshot of the step before, so the
        digest of any other step is never compared. Skip the gradient copy and digest otherwise."""
        return self.schedule.is_recomputable(step)

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
        check_step(step)
        objects = state_module.objects_of(model_or_state, optimizer)
        state_module.validate(extra, "extra")
        self._handoff.start(step, objects, extra, background=self.background_capture)
        self.schedule.snapshotted_step = step

    def wait_for_capture(self) -> float:
        """Blocks until the in-flight snapshot's copy has landed; returns the seconds waited.

        Call it before changing parameters or optimizer state other than by `optimizer.step()`
        (which calls it itself) while a snapshot may be in flight.
        """
        return self._handoff.wait_for_capture()

    def wait_for_snapshots(self) -> None:
        """Block until the in-flight snapshot (if any) is acknowledged; raise its error."""
        self._handoff.await_inflight(count_wait=False)

    def snapshot_barrier(self) -> float:
        """Waits for the previous snapshot's hand-off; returns the seconds waited.

        Call it in every step before the gradient synchronisation (before `backward()` under
        DDP). No rank can then finish step S+1 before every rank's snapshot of step S is held by
        its node and its buddy, so a failure at any moment loses at most the steps since the last
        snapshot (k, the cadence). The hand-off normally finishes during the forward pass and the
        wait is zero; with nothing in flight it returns at once.
        """
        started = time.monotonic()
        self._handoff.await_inflight(count_wait=True)
        return time.monotonic() - started

    def on_generation_replaced(self, callback: Callable[[], None]) -> None:
        """Calls `callback` (from a background thread) once the agent replaces the generation
        this rank runs, again after each rejoin; never after `finish`. The fast path passes a
        process-group abort: a rank blocked in a collective on a dead peer gets out at once."""
        self._on_replaced = callback
        self._start_watch()

    def _start_watch(self) -> None:
        callback = self._on_replaced
        if callback is None:
            return
        generation = self.generation
        generation_watch.start(self._client, generation, self.rank,
                               is_current=lambda: not self._finished and self.generation == generation,
                               is_closed=lambda: self._closed, on_replaced=callback)

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
        self._steps.drop()
        self._steps.hurry.set()  # a send waiting out its window goes now (with nothing): no wait
        self._reports.drop(REJOIN_DRAIN_S)
        self._steps.hurry.clear()
        self._handoff.drop(REJOIN_DRAIN_S)
        try:
            answer = self._client.await_generation(old_generation, old_rank, wait_s)
        except AgentLinkError:
            return False
        if not answer.assigned:
            return False
        env = {e.name: e.value for e in answer.env}
        os.environ.update(env)
        rendezvous_store.prestart()  # the new rank 0 listens before the others dial; they wait for it
        rendezvous_store.await_host()
        self.launch = LaunchEnv.from_mapping(os.environ)
        fresh = CheckpointEnv.from_mapping(os.environ)
        self.checkpoints = dataclasses.replace(fresh, read_timeout_s=self.checkpoints.read_timeout_s,
                                               retry_deadline_s=self.checkpoints.retry_deadline_s)
        self.schedule.restart(self.launch.restore_step or 0)
        self.schedule.snapshotted_step = None
        self.rejoins += 1
        self._start_watch()
        return True

    def finish(self, step: int, param_digest: str) -> None:
        """Report that this rank completed its last step, after all hand-offs are done."""
        self._check_open()
        check_step(step)
        self._finished = True  # the generation ending now (job complete) must not abort the group
        self._handoff.await_inflight(count_wait=False)
        self._steps.flush()
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
        if self._liveness_state is None:
            self._liveness_state = liveness.Liveness(self._client.report_liveness,
                                                     lambda: (self.launch.generation, self.launch.rank))
        return self._liveness_state

    def close(self) -> None:
        """Stop the background threads (finishing queued work) and close the channel."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._steps.hurry.set()  # what waits for its window goes now
        self._reports.close()
        self._handoff.close()
        self._client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _send_step_reports(self, reports: list[agent_pb2.StepReport]) -> None:
        """On the report thread: one window's reports in one call (one alone as ReportStep)."""
        if len(reports) > 1 and self._batched_reports and self._steps.window_s > 0:
            try:
                ack = self._client.report_steps(reports)
            except AgentLinkError as exc:
                if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self._batched_reports = False  # an agent older than ReportSteps: one call each from now on
            else:
                self._note_ack(reports[-1].step, ack)
                return
        for report in reports:
            self._note_ack(report.step, self._client.report_step(report))

    def _note_ack(self, step: int, ack: Any) -> None:
        self._checkpoints.note_requested(step, list(getattr(ack, "checkpoint_steps", ()) or ()))

    def _snapshot_header(self, step: int) -> peer_pb2.SnapshotHeader:
        return peer_pb2.SnapshotHeader(generation=self.generation, rank=self.rank, step=step,
                                       owner_node_id=self.node_id)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("session is closed")
