"""Trainer lifecycle on this node: applies Directives idempotently, keyed by generation.

Owns the running generation's trainer processes (through a `ProcessRunner`) and reports each
exit as a TrainerExit. The decision of what a directive means is pure (agent/core/directives.py);
this module only carries it out. Rule: trainers of a replaced generation are SIGKILLed and reaped
before any trainer of the new one starts, so two generations never share the node.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import structlog
from ftsup.v1 import agent_pb2

from agent.config import AgentConfig
from agent.core.directives import Action, Applied, Decision, Step, diff_directive, validate_run
from agent.core.trainer_env import RankSpec, log_file_name, trainer_env
from agent.process import ProcessHandle, ProcessRunner, SpawnFailed
from agent.restore import RestoreBook, RestoreSource
from agent.snapshots import SnapshotStore

Logger = structlog.typing.FilteringBoundLogger

STOP_GRACE_S = 3.0
MAX_CHECKPOINT_STEPS = 8  # requested checkpoint steps remembered per generation
SPAWN_FAILED_EXIT_CODE = 127  # as a shell reports a command it could not run

Report = Callable[[agent_pb2.AgentMessage], None]


@dataclass(eq=False)
class Trainer:
    rank: int
    local_rank: int
    handle: ProcessHandle
    watcher: asyncio.Task[None] | None = None
    exit_code: int | None = None


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

    def live(self) -> list[Trainer]:
        return [t for t in self.trainers.values() if t.exit_code is None]


def _merged(known: tuple[int, ...], sent: Iterable[int]) -> tuple[int, ...]:
    """Requested steps are only ever added while a generation runs (a request that started drops
    out of the directive, but a rank that has not reached it yet must still be told); the newest
    few are kept."""
    return tuple(sorted(set(known) | set(sent)))[-MAX_CHECKPOINT_STEPS:]


def _action(value: int) -> Action | None:
    return {agent_pb2.ACTION_RUN: Action.RUN, agent_pb2.ACTION_STANDBY: Action.STANDBY}.get(value)


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
    ) -> None:
        self._config = config
        self._runner = runner
        self._store = store
        self._restores = restores
        self._report = report
        self._base_env = dict(base_env)
        self._log = log
        self._stop_grace_s = stop_grace_s
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
                await self._kill_all()
                self._applied = Applied(directive.generation, Action.RUN)
                await self._start(directive)
            case Step.UPDATE:
                assert self.run is not None
                self.run.retain_from_step = directive.retain_from_step
                self.run.buddy_node_id = directive.buddy_node_id
                self.run.buddy_address = directive.buddy_address
                self.run.checkpoint_steps = _merged(self.run.checkpoint_steps, directive.checkpoint_steps)
                self._store.set_retain_from_step(directive.retain_from_step)
            case Step.STOP:
                self._applied = Applied(directive.generation, Action.STANDBY)
                await self.stop(self._stop_grace_s)
            case Step.NOOP:
                pass
        return decision

    async def _start(self, d: agent_pb2.Directive) -> None:
        restore_step = d.restore_step if d.HasField("restore_step") else None
        run = Run(
            generation=d.generation,
            ranks=tuple(d.ranks),
            restore_step=restore_step,
            buddy_node_id=d.buddy_node_id,
            buddy_address=d.buddy_address,
            retain_from_step=d.retain_from_step,
            checkpoint_steps=_merged((), d.checkpoint_steps),
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
            )
            env = {**self._base_env, **trainer_env(spec, directive_env)}
            log_path = self._config.workdir / log_file_name(rank, d.generation)
            try:
                handle = await self._runner.spawn(list(d.argv), env, log_path)
            except SpawnFailed as exc:
                self._log.error("trainer_spawn_failed", generation=d.generation, rank=rank, error=str(exc))
                self._send_exit(run, rank, SPAWN_FAILED_EXIT_CODE)
                continue
            trainer = Trainer(rank, local_rank, handle)
            trainer.watcher = asyncio.create_task(self._watch(run, trainer))
            run.trainers[rank] = trainer
            self._log.info("trainer_started", generation=d.generation, rank=rank, pid=handle.pid, log=str(log_path))

    async def _watch(self, run: Run, trainer: Trainer) -> None:
        code = await self._runner.wait(trainer.handle)
        trainer.exit_code = code
        self._log.info(
            "trainer_exited", generation=run.generation, rank=trainer.rank, exit_code=code,
            finished=trainer.rank in run.finished,
        )
        self._send_exit(run, trainer.rank, code)

    def _send_exit(self, run: Run, rank: int, code: int) -> None:
        self._report(
            agent_pb2.AgentMessage(
                trainer_exit=agent_pb2.TrainerExit(
                    generation=run.generation, rank=rank, exit_code=code, finished=rank in run.finished
                )
            )
        )

    async def _kill_all(self) -> None:
        """SIGKILLs every trainer (they belong to a dead generation) and waits until reaped."""
        if self.run is not None:
            self._dying.extend(self.run.trainers.values())
        self._restores.cancel()
        for trainer in self._dying:
            self._runner.signal(trainer.handle, signal.SIGKILL)
        await asyncio.gather(*(t.watcher for t in self._dying if t.watcher is not None))
        self._dying.clear()

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
