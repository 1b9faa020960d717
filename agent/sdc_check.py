"""SDC recompute checks on this node as a verifier: fetch the snapshot, run the replay, answer.

Owns the replays this node runs for the supervisor's open checks (Directive.sdc_checks). For
each new order it takes rank r's snapshot of step S - 1 from its own RAM store or a holder's
(peer fetch, verified), writes it and a request file to its workdir, runs the job's trainer
command in replay mode (FTSUP_SDC_REPLAY, trainer/replay.py) through the `ProcessRunner` seam,
and sends an SdcCheckResult with the recomputed digests, or with the error that prevented them.
An order gone from the directive stops its replay (SIGKILL, reaped). Answers are kept while
their check is ordered and sent again to a new supervisor session (resync), so an answer lost
with a dying leader is not lost for the check. Never raises into the directive loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog

from ftsup.agent.core import sdc_replay
from ftsup.agent.peers import PeerClient, PeerDenied, PeerUnavailable, SnapshotMissing
from ftsup.agent.process import ProcessHandle, ProcessRunner, SpawnFailed
from ftsup.agent.snapshots import Blob, InvalidSnapshot, SnapshotStore
from ftsup.common.deadline import within
from ftsup.v1 import agent_pb2, events_pb2

Logger = structlog.typing.FilteringBoundLogger
Report = Callable[[agent_pb2.AgentMessage], None]

# A backstop only: the supervisor times a check out first (--sdc-recompute-timeout-s) and the
# order's disappearance stops the replay.
REPLAY_DEADLINE_S = 1800.0
# How long a verifier asks again holders that refused it: its grant may reach them after its order.
GRANT_WAIT_S = 5.0
GRANT_RETRY_FIRST_S = 0.1


class SdcChecker:
    def __init__(self, node_id: str, workdir: Path, store: SnapshotStore, peers: PeerClient, runner: ProcessRunner,
                 base_env: Mapping[str, str], report: Report, log: Logger,
                 deadline_s: float = REPLAY_DEADLINE_S) -> None:
        self._node_id = node_id
        self._workdir = workdir / "sdc"
        self._store = store
        self._peers = peers
        self._runner = runner
        self._base_env = dict(base_env)
        self._report = report
        self._log = log
        self._deadline_s = deadline_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._answers: dict[str, agent_pb2.AgentMessage] = {}

    def apply(self, orders: Sequence[agent_pb2.SdcCheckOrder]) -> None:
        """Starts new orders, stops those no longer ordered (called with every directive)."""
        by_id = {o.check_id: o for o in orders if o.check_id}
        plan = sdc_replay.reconcile(by_id, self._tasks, self._answers)
        for check_id in plan.stop:
            self._answers.pop(check_id, None)
            task = self._tasks.pop(check_id, None)
            if task is not None:
                task.cancel()
                self._log.info("sdc_replay_stopped", check_id=check_id, reason="no longer ordered")
        for check_id in plan.start:
            order = by_id[check_id]
            self._log.info("sdc_replay_ordered", check_id=check_id, generation=order.generation, step=order.step,
                           rank=order.rank,
                           ranks=list(order.replay_ranks))
            self._tasks[check_id] = asyncio.create_task(self._run(order))

    def resync(self) -> list[agent_pb2.AgentMessage]:
        """Answers of checks still ordered, for a new supervisor session."""
        return list(self._answers.values())

    def running(self) -> list[str]:
        return sorted(self._tasks)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def _run(self, order: agent_pb2.SdcCheckOrder) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            answer = await within(self._replay(order), self._deadline_s)
        except TimeoutError:
            answer = sdc_replay.failed(f"the replay took longer than {self._deadline_s:g}s on {self._node_id}")
        except Exception as exc:
            self._log.exception("sdc_replay_failed", check_id=order.check_id, generation=order.generation,
                                step=order.step, rank=order.rank)
            answer = sdc_replay.failed(f"{type(exc).__name__}: {exc}")
        elapsed = loop.time() - started
        message = agent_pb2.AgentMessage(sdc_check_result=agent_pb2.SdcCheckResult(
            check_id=order.check_id, step=order.step, rank=order.rank, error=answer.error, replay_s=elapsed,
            recomputed=[events_pb2.SdcRankDigests(rank=d.rank, node_id=self._node_id, grad_digest=d.grad_digest,
                                                  param_digest=d.param_digest) for d in answer.recomputed],
        ))
        self._tasks.pop(order.check_id, None)
        self._answers[order.check_id] = message
        self._log.info("sdc_replay_answered", check_id=order.check_id, generation=order.generation, step=order.step,
                       rank=order.rank, replay_s=round(elapsed, 3),
                       error=answer.error or None, ranks=[d.rank for d in answer.recomputed])
        self._report(message)

    async def _replay(self, order: agent_pb2.SdcCheckOrder) -> sdc_replay.Answer:
        blob = await self._snapshot(order)
        if isinstance(blob, str):
            return sdc_replay.failed(blob)
        where = self._workdir / order.check_id
        where.mkdir(parents=True, exist_ok=True)
        snapshot_path, request_path, out_path = where / "snapshot.bin", where / "request.json", where / "answer.json"
        await asyncio.to_thread(snapshot_path.write_bytes, blob.payload)
        request_path.write_text(json.dumps(sdc_replay.request_body(
            order.check_id, order.step, order.rank, order.world_size, list(order.replay_ranks),
            str(snapshot_path), blob.sha256, str(out_path))))
        env = sdc_replay.replay_env(self._base_env, [(e.name, e.value) for e in order.env], str(request_path))
        log_path = self._workdir / f"{order.check_id}.log"
        try:
            code = await self._spawn_and_wait(list(order.argv), env, log_path)
            if code != 0:
                return sdc_replay.failed(f"the replay exited with code {code} on {self._node_id} (log {log_path})")
            if not out_path.exists():
                return sdc_replay.failed(f"the replay wrote no answer on {self._node_id} (log {log_path})")
            try:
                raw = json.loads(out_path.read_text())
            except ValueError as exc:
                return sdc_replay.failed(f"unreadable replay answer: {exc}")
            return sdc_replay.parse_answer(raw, order.check_id, list(order.replay_ranks))
        finally:
            shutil.rmtree(where, ignore_errors=True)  # the snapshot is model-sized; the log stays

    async def _spawn_and_wait(self, argv: list[str], env: dict[str, str], log_path: Path) -> int:
        try:
            handle: ProcessHandle = await self._runner.spawn(argv, env, log_path)
        except SpawnFailed as exc:
            raise RuntimeError(f"cannot start the replay: {exc}") from exc
        try:
            return await self._runner.wait(handle)
        except asyncio.CancelledError:
            self._runner.signal(handle, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._runner.wait(handle))  # reaped: no orphan replay
            raise

    async def _snapshot(self, order: agent_pb2.SdcCheckOrder) -> Blob | str:
        """Rank r's snapshot of step S - 1: this node's RAM first, then each holder in order."""
        rank, step = order.rank, order.step - 1
        held = self._store.get(rank, step)
        if held is not None:
            return held
        # The holders learn that this node may fetch from the same event that ordered the check, but
        # on their own streams: a holder that has not seen it yet refuses (PERMISSION_DENIED). Seen
        # in CI as an inconclusive check; denied rounds are asked again for up to GRANT_WAIT_S.
        waited_s, delay_s = 0.0, GRANT_RETRY_FIRST_S
        while True:
            tried: list[str] = []
            denied = False
            for source in order.sources:
                if source.node_id == self._node_id or not source.address:
                    continue
                try:
                    blob = await self._peers.fetch(source.address, rank, step, generation=order.generation,
                                                   node_id=source.node_id)
                except (PeerUnavailable, SnapshotMissing, InvalidSnapshot) as exc:
                    denied = denied or isinstance(exc, PeerDenied)
                    tried.append(f"{source.node_id}: {exc}")
                    continue
                return blob  # verified against its SHA-256 by the fetch
            if not denied or waited_s + delay_s > GRANT_WAIT_S:
                return f"no holder had rank {rank}'s snapshot of step {step}: " + (
                    "; ".join(tried) or "no holders named")
            await asyncio.sleep(delay_s)
            waited_s, delay_s = waited_s + delay_s, min(2 * delay_s, 1.0)
