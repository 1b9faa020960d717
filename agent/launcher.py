"""Trainer lifecycle on this node: applies Directives idempotently, keyed by generation.

Owns the running generation's trainer processes (through a `ProcessRunner`) and reports each
exit as a TrainerExit. The decision of what a directive means is pure (agent/core/directives.py);
this module only carries it out. Rule: trainers of a replaced generation are SIGKILLed and reaped
before any trainer of the new one starts, so two generations never share the node.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import structlog

from ftsup.agent.config import AgentConfig
from ftsup.agent.core.directives import Action, Applied, Decision, Step, diff_directive, validate_run
from ftsup.agent.core.output_tail import READ_BYTES, failure_tail
from ftsup.agent.core.trainer_env import RankSpec, error_file_name, log_file_name, trainer_env
from ftsup.agent.process import ProcessHandle, ProcessRunner, SpawnFailed
from ftsup.agent.restore import RestoreBook, RestoreSource
from ftsup.agent.snapshots import SnapshotStore
from ftsup.common.deadline import within
from ftsup.v1 import agent_pb2

Logger = structlog.typing.FilteringBoundLogger

STOP_GRACE_S = 3.0
# A rank that reported finish() is done training but may still have work of its own (an HF or
# Lightning script saves its model after train()): it gets this long to exit before any signal.
FINISHED_EXIT_GRACE_S = 30.0
# A new generation waits config.rejoin_wait_s (--rejoin-wait-s, 0.5 s) for a first broken rank of
# this node to ask to rejoin (a replaced hand-off fails them within ms), and twice that for the rest.
MAX_CHECKPOINT_STEPS = 8  # requested checkpoint steps remembered per generation
SPAWN_FAILED_EXIT_CODE = 127  # as a shell reports a command it could not run
# Standby causes that stop trainers parked for a rejoin (core/directives.py StandbyCause.is_final):
# no next generation will adopt them on this node.
_FINAL_STANDBY = frozenset({agent_pb2.STANDBY_CAUSE_JOB_COMPLETED, agent_pb2.STANDBY_CAUSE_JOB_FAILED,
                            agent_pb2.STANDBY_CAUSE_QUARANTINED, agent_pb2.STANDBY_CAUSE_DRAINED})

Report = Callable[[agent_pb2.AgentMessage], None]


@dataclass(eq=False)
class Trainer:
    rank: int
    local_rank: int
    handle: ProcessHandle
    watcher: asyncio.Task[None] | None = None
    exit_code: int | None = None
    generation: int = 0  # the generation it runs (changes when it rejoins in-process)
    # Set while the process waits in AwaitGeneration: its process group broke and it asks to be
    # given the next generation's rank in place of a restart (the in-process fast path).
    rejoin: asyncio.Future[dict[str, str] | str] | None = None
    can_rejoin: bool = False  # it watches its generation (WatchGeneration): it takes the fast path
    log_path: pathlib.Path | None = None
    error_file: pathlib.Path | None = None


@dataclass(eq=False)
class Run:
    """One generation as this node runs it. Read by the trainer service, written only here."""

    generation: int
    ranks: tuple[int, ...]
    restore_step: int | None
    buddy_node_id: str
    buddy_address: str
    retain_from_step: int
    checkpoint_steps: tuple[int, ...] = ()  # requested off the cadence; ranks learn them from step acks
    trainers: dict[int, Trainer] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    # Ranks that opened a Session (talked to the trainer service): their exit 0 must be a
    # finish they reported. A rank that never did is a plain torchrun script (level 0).
    attached: set[int] = field(default_factory=set)
    stop_grace_s: float = 0.0  # the job's SIGTERM grace; 0: the agent's default
    # Set once a directive replaces this generation: work still under way for it (a snapshot
    # hand-off waiting on a dead buddy) ends at once, so its ranks reach the fast path.
    replaced: asyncio.Event = field(default_factory=asyncio.Event)

    def live(self) -> list[Trainer]:
        return [t for t in self.trainers.values() if t.exit_code is None]


def _merged(known: tuple[int, ...], sent: Iterable[int]) -> tuple[int, ...]:
    """Requested steps are only ever added while a generation runs (a request that started drops
    out of the directive, but a rank that has not reached it yet must still be told); the newest
    few are kept."""
    return tuple(sorted(set(known) | set(sent)))[-MAX_CHECKPOINT_STEPS:]


def _action(value: agent_pb2.Action.ValueType) -> Action | None:
    return {agent_pb2.ACTION_RUN: Action.RUN, agent_pb2.ACTION_STANDBY: Action.STANDBY}.get(value)


def _read_tail(trainer: Trainer) -> str:
    """The failure record's output: torch's recorded exception, else the end of the rank's log."""
    log_end = b""
    if trainer.log_path is not None:
        try:
            with open(trainer.log_path, "rb") as log:
                log.seek(max(0, os.fstat(log.fileno()).st_size - READ_BYTES))
                log_end = log.read(READ_BYTES)
        except OSError:
            pass
    recorded = None
    if trainer.error_file is not None:
        try:
            with open(trainer.error_file, "rb") as error_file:
                recorded = json.loads(error_file.read(READ_BYTES * 4))
        except (OSError, ValueError):
            pass
    return failure_tail(log_end, recorded)


class Launcher:
    def __init__(
        self,
        config: AgentConfig,
        runner: ProcessRunner,
        store: SnapshotStore,
        restores: RestoreBook,
        report: Report,
        base_env: Mapping[str, str],
        log: Logger,
        stop_grace_s: float = STOP_GRACE_S,
        finished_exit_grace_s: float = FINISHED_EXIT_GRACE_S,
    ) -> None:
        self._config = config
        self._runner = runner
        self._store = store
        self._restores = restores
        self._report = report
        self._base_env = dict(base_env)
        self._log = log
        self._stop_grace_s = stop_grace_s
        self._finished_exit_grace_s = finished_exit_grace_s
        self._applied: Applied | None = None
        self.run: Run | None = None  # the generation last started (its trainers may have exited)
        self._dying: list[Trainer] = []  # trainers of replaced generations not yet reaped

    def running(self) -> tuple[int, tuple[int, ...], set[int]]:
        """(generation, its ranks here, ranks whose process is alive); (0, (), set()) when idle."""
        if self.run is None:
            return 0, (), set()
        return self.run.generation, self.run.ranks, {t.rank for t in self.run.live()}

    def running_generation(self) -> int:
        """The generation whose trainers are alive on this node, 0 when none are."""
        return self.run.generation if self.run is not None and self.run.live() else 0

    def is_writing(self, log_path: pathlib.Path) -> bool:
        """Whether a live trainer process still appends to `log_path` (a log follow ends when not)."""
        trainers = list(self._dying) + (list(self.run.trainers.values()) if self.run is not None else [])
        return any(t.log_path == log_path and t.exit_code is None for t in trainers)

    def mark_attached(self, generation: int, rank: int) -> None:
        """The rank uses a Session (it called the trainer service): not a plain script."""
        if self.run is not None and self.run.generation == generation and rank in self.run.ranks:
            self.run.attached.add(rank)

    def mark_finished(self, generation: int, rank: int) -> bool:
        """Records ReportFinished; False when (generation, rank) is not run here."""
        if self.run is None or self.run.generation != generation or rank not in self.run.ranks:
            return False
        self.run.finished.add(rank)
        return True

    async def apply(self, directive: agent_pb2.Directive) -> Decision:
        """Carries out one directive; never raises for bad input (it is logged and ignored)."""
        live = bool(self.run and self.run.live()) or any(t.exit_code is None for t in self._dying)
        action = _action(directive.action)
        decision = diff_directive(self._applied, directive.generation, action, has_live_trainers=live)
        if action is Action.RUN and decision.step in (Step.START, Step.RESTART):
            problem = validate_run(directive.generation, list(directive.ranks), directive.world_size, list(directive.argv))
            if problem is not None:
                decision = Decision(Step.IGNORE, problem)
        log = self._log.bind(generation=directive.generation)
        if decision.step is Step.IGNORE:
            log.warning("directive_ignored", reason=decision.reason)
            return decision
        log.info("directive_applied", step=decision.step.value, reason=decision.reason)
        match decision.step:
            case Step.START | Step.RESTART:
                if self.run is not None:
                    self.run.replaced.set()
                adopted = await self._rejoiners_for(directive) if action is Action.RUN else []
                if adopted and self.run is not None:
                    for trainer in adopted:
                        del self.run.trainers[trainer.rank]  # not killed: they join the new generation
                await self._kill_all()
                self._applied = Applied(directive.generation, Action.RUN)
                await self._start(directive, adopted)
            case Step.UPDATE:
                assert self.run is not None
                self.run.retain_from_step = directive.retain_from_step
                self.run.buddy_node_id = directive.buddy_node_id
                self.run.buddy_address = directive.buddy_address
                self.run.checkpoint_steps = _merged(self.run.checkpoint_steps, directive.checkpoint_steps)
                self._store.set_retain_from_step(directive.retain_from_step)
            case Step.STOP:
                if self.run is not None:
                    self.run.replaced.set()
                self._applied = Applied(directive.generation, Action.STANDBY)
                if await self._park_rejoiners(directive):
                    return decision
                grace = self.run.stop_grace_s if self.run is not None and self.run.stop_grace_s > 0 else 0.0
                await self._let_finished_exit(self._finished_exit_grace_s)
                await self.stop(grace or self._stop_grace_s)
            case Step.NOOP:
                pass
        return decision

    def watching(self, generation: int, rank: int) -> Run | None:
        """A trainer watches its generation (it can rejoin in-process): the run it is in, or None."""
        run = self.run
        trainer = run.trainers.get(rank) if run is not None and run.generation == generation else None
        if trainer is None:
            return None
        trainer.can_rejoin = True
        return run

    async def await_generation(self, generation: int, rank: int, wait_s: float) -> dict[str, str] | str:
        """A live trainer of `generation` whose group broke waits for the next generation; the
        answer is its new environment, or why not (then it exits and is restarted as before)."""
        run = self.run
        trainer = run.trainers.get(rank) if run is not None and run.generation == generation else None
        if trainer is None or trainer.exit_code is not None:
            return f"rank {rank} of generation {generation} is not running on this node"
        loop = asyncio.get_running_loop()
        trainer.rejoin = loop.create_future()
        try:
            return await within(asyncio.shield(trainer.rejoin), wait_s)
        except TimeoutError:
            return f"no new generation for this node within {wait_s:g}s"
        finally:
            if trainer.rejoin is not None and not trainer.rejoin.done():
                trainer.rejoin.set_result("gave up waiting")
            trainer.rejoin = None

    async def _park_rejoiners(self, d: agent_pb2.Directive) -> bool:
        """Between generations (waiting for a spare, say) trainers waiting to rejoin are kept:
        the next RUN directive adopts them. Not on a quarantined or drained node, and not once
        the job completed: those stop (the directive's typed cause says which; an older supervisor
        sends none, and its parked trainers give up after their rejoin wait). True: every live
        trainer is parked, nothing to stop."""
        run = self.run
        if run is None or d.standby_cause in _FINAL_STANDBY:
            return False
        live = run.live()
        if not live or not all(t.can_rejoin for t in live):
            return False
        await asyncio.sleep(0)  # let a hand-off that just failed reach AwaitGeneration
        deadline = asyncio.get_running_loop().time() + 2 * self._config.rejoin_wait_s
        while not all(t.rejoin is not None and not t.rejoin.done() for t in run.live()):
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        self._log.info("trainers_parked", generation=run.generation, ranks=sorted(t.rank for t in run.live()),
                       reason="waiting in-process for the next generation")
        return True

    async def _rejoiners_for(self, d: agent_pb2.Directive) -> list[Trainer]:
        """The live trainers that can take the new generation's ranks here in-process: every live
        trainer of the old run is waiting to rejoin and there are as many as the node's new ranks.
        A broken group fails every rank at once, so the rest are waited for briefly; if none asks
        (ranks blocked in a collective, e.g. a hung peer) they are restarted as before."""
        run = self.run
        if run is None:
            return []
        if not any(t.can_rejoin for t in run.live()):
            return []  # trainers that never asked to rejoin are restarted at once, as before
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            live = run.live()
            waiting = [t for t in live if t.rejoin is not None and not t.rejoin.done()]
            waited = loop.time() - started
            if waiting and len(waiting) == len(live):
                break
            # Nobody asking after a moment: blocked in a collective (a hung peer), not rejoining.
            if waited >= (2 if waiting else 1) * self._config.rejoin_wait_s:
                break
            await asyncio.sleep(0.02)
        if not waiting or len(waiting) != len(live) or len(live) != len(d.ranks):
            for trainer in waiting:
                if trainer.rejoin is not None and not trainer.rejoin.done():
                    trainer.rejoin.set_result("restarted instead: not every rank of this node could rejoin")
            return []
        return sorted(waiting, key=lambda t: t.local_rank)

    async def _start(self, d: agent_pb2.Directive, adopted: list[Trainer] | None = None) -> None:
        restore_step = d.restore_step if d.HasField("restore_step") else None
        run = Run(
            generation=d.generation,
            ranks=tuple(d.ranks),
            restore_step=restore_step,
            buddy_node_id=d.buddy_node_id,
            buddy_address=d.buddy_address,
            retain_from_step=d.retain_from_step,
            checkpoint_steps=_merged((), d.checkpoint_steps),
            stop_grace_s=d.stop_grace_s,
        )
        self.run = run
        self._store.set_retain_from_step(d.retain_from_step)
        # Processes first, restores concurrently: GetRestore blocks each rank until it is ready.
        self._restores.begin(
            d.generation,
            run.ranks,
            restore_step,
            [RestoreSource(r.rank, r.kind, r.source_node_id, r.source_address,
                           r.source_rank if r.HasField("source_rank") else None) for r in d.restores],
        )
        directive_env = [(e.name, e.value) for e in d.env]
        for local_rank, rank in enumerate(run.ranks):
            spec = RankSpec(
                generation=d.generation,
                rank=rank,
                local_rank=local_rank,
                local_world_size=len(run.ranks),
                world_size=d.world_size,
                master_addr=d.master_addr,
                master_port=d.master_port,
                node_id=self._config.node_id,
                agent_address=self._config.trainer_link_address,
                restore_step=restore_step,
                restart_count=d.restart_count,
                max_restarts=d.max_restarts,
                run_id=d.job_name,
                error_file=str(self._config.workdir / error_file_name(rank, d.generation)),
            )
            env = {**self._base_env, **trainer_env(spec, directive_env, self._base_env)}
            log_path = self._config.workdir / log_file_name(rank, d.generation)
            if adopted:
                trainer = adopted[local_rank]
                assert trainer.rejoin is not None
                trainer.rank, trainer.local_rank, trainer.generation = rank, local_rank, d.generation
                run.trainers[rank] = trainer
                trainer.rejoin.set_result(trainer_env(spec, directive_env, self._base_env))
                self._log.info("trainer_rejoined", generation=d.generation, rank=rank, pid=trainer.handle.pid)
                continue
            try:
                handle = await self._runner.spawn(list(d.argv), env, log_path, pathlib.Path(d.cwd) if d.cwd else None)
            except SpawnFailed as exc:
                self._log.error("trainer_spawn_failed", generation=d.generation, rank=rank, error=str(exc))
                self._send_exit(run.generation, rank, SPAWN_FAILED_EXIT_CODE, finished=False, tail=str(exc))
                continue
            trainer = Trainer(rank, local_rank, handle, generation=d.generation, log_path=log_path,
                              error_file=pathlib.Path(spec.error_file))
            trainer.watcher = asyncio.create_task(self._watch(trainer))
            run.trainers[rank] = trainer
            self._log.info("trainer_started", generation=d.generation, rank=rank, pid=handle.pid, log=str(log_path))

    async def _watch(self, trainer: Trainer) -> None:
        code = await self._runner.wait(trainer.handle)
        trainer.exit_code = code
        # The generation it ran when it exited: a rejoined process may have moved on since start.
        current = self.run is not None and self.run.generation == trainer.generation
        finished = current and self.run is not None and trainer.rank in self.run.finished
        is_plain = current and self.run is not None and trainer.rank not in self.run.attached
        tail = "" if code == 0 else _read_tail(trainer)
        self._log.info("trainer_exited", generation=trainer.generation, rank=trainer.rank, exit_code=code,
                       finished=finished, is_plain_script=is_plain)
        self._send_exit(trainer.generation, trainer.rank, code, finished, tail=tail, is_plain_script=is_plain)

    def _send_exit(self, generation: int, rank: int, code: int, finished: bool, *, tail: str = "",
                   is_plain_script: bool = False) -> None:
        self._report(agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(
            generation=generation, rank=rank, exit_code=code, finished=finished, output_tail=tail,
            is_plain_script=is_plain_script)))

    async def _kill_all(self) -> None:
        """SIGKILLs every trainer (they belong to a dead generation) and waits until reaped."""
        if self.run is not None:
            self._dying.extend(self.run.trainers.values())
        self._restores.cancel()
        for trainer in self._dying:
            self._runner.signal(trainer.handle, signal.SIGKILL)
        await asyncio.gather(*(t.watcher for t in self._dying if t.watcher is not None))
        self._dying.clear()

    async def _let_finished_exit(self, timeout_s: float) -> None:
        """Waits (up to `timeout_s`) for the trainers whose rank reported finish() to exit by
        themselves: signalling them at once would cut off what a script does after training."""
        run = self.run
        if run is None or not run.finished:
            return
        watchers = [t.watcher for t in run.trainers.values()
                    if t.rank in run.finished and t.exit_code is None and t.watcher is not None]
        if watchers:
            await asyncio.wait(watchers, timeout=timeout_s)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL whatever is alive after `grace_s`; returns once all are reaped."""
        trainers = list(self._dying) + (list(self.run.trainers.values()) if self.run is not None else [])
        watchers = [t.watcher for t in trainers if t.watcher is not None and t.exit_code is None]
        for trainer in trainers:
            self._runner.signal(trainer.handle, signal.SIGTERM)
        if watchers:
            _, pending = await asyncio.wait(watchers, timeout=grace_s)
            if pending:
                for trainer in trainers:
                    if trainer.exit_code is None:
                        self._runner.signal(trainer.handle, signal.SIGKILL)
                await asyncio.gather(*pending)
        self._restores.cancel()
        self._dying.clear()
