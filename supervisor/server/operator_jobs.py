"""The Operator service's job-wide methods: goodput, stragglers, checkpoints, restart, checkpoint now.

A mixin of OperatorService (kept apart so each module stays short). Reads come from the log
digest (log_digest.py) and the runtime's pure views; the restart command goes through the same
OperatorRequest path as quarantine and drain (admission, decide, the fenced append).
Authorization is not here: operator_guard.py wraps every method (restart and checkpoint now need
admin because authz.py does not list them as read-only).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from ftsup.common import logs
from ftsup.supervisor import codec
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.events import CheckpointRequested, GenerationStarted
from ftsup.supervisor.core.goodput import GoodputReport
from ftsup.supervisor.core.inputs import OperatorCommandKind, OperatorRequest
from ftsup.supervisor.core.limits import MAX_TEXT
from ftsup.supervisor.core.views import straggler_views
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server.log_digest import LogDigest
from ftsup.supervisor.server.operator_guard import principal
from ftsup.v1 import operator_pb2

log = logs.get("supervisor.operator")

NO_STORE_CADENCE = "no checkpoint store configured (--checkpoint-location): trainers save on their own, if at all"


def _cadence_text(config: CoreConfig) -> str:
    if not config.checkpoint_location:
        return NO_STORE_CADENCE
    parts = []
    if config.checkpoint_every_steps > 0:
        parts.append(f"every {config.checkpoint_every_steps} steps")
    if config.checkpoint_timing.is_auto:
        parts.append("at the Young/Daly interval (auto)")
    how = " and ".join(parts) if parts else "only on request (`supervisorctl checkpoint now`)"
    return (f"{how} to {config.checkpoint_location}; an attempt not committed within"
            f" {config.checkpoint_timing.timeout_s:g}s is aborted")


def goodput_to_proto(report: GoodputReport) -> operator_pb2.GetGoodputResponse:
    response = operator_pb2.GetGoodputResponse(
        wall_s=report.wall_s,
        productive_s=report.productive_s,
        detection_s=report.detection_s,
        restart_s=report.restart_s,
        lost_work_s=report.lost_work_s,
        waiting_s=report.waiting_s,
        unsaved_s=report.unsaved_s,
        generations=report.generations,
        interruptions=report.interruptions,
        interruptions_by_reason=[operator_pb2.ReasonCount(reason=r, count=n) for r, n in report.interruptions_by_reason],
        lost_steps=report.lost_steps,
        until_unix_s=report.until_unix_s,
        first_seq=report.first_seq,
        notes=list(report.notes),
    )
    if report.ettr is not None:
        response.ettr = report.ettr
    if report.checkpoint_pause_s is not None:
        response.checkpoint_pause_s = report.checkpoint_pause_s
    if report.since_unix_s is not None:
        response.since_unix_s = report.since_unix_s
    return response


async def require_reason(reason: str, context: grpc.aio.ServicerContext) -> None:
    """A blank or overlong reason is a bad argument (INVALID_ARGUMENT), not a state the cluster is in."""
    if not reason.strip():
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a reason is required (it is recorded in the event log)")
    if len(reason) > MAX_TEXT:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the reason has {len(reason)} characters; at most {MAX_TEXT} are recorded")


class JobMethods:
    _runtime: Runtime
    _digest: LogDigest
    wall_clock: Callable[[], float] = staticmethod(time.time)  # the "now" goodput runs until; tests pin it

    async def _goodput(self) -> GoodputReport:
        await self._digest.catch_up(self._runtime.event_log)
        return self._digest.goodput(self.wall_clock())

    async def GetGoodput(
        self, request: operator_pb2.GetGoodputRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.GetGoodputResponse:
        return goodput_to_proto(await self._goodput())

    async def ListStragglers(
        self, request: operator_pb2.ListStragglersRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ListStragglersResponse:
        await self._digest.catch_up(self._runtime.event_log)
        config = self._runtime.config.straggler
        generation, ranks = straggler_views(self._runtime.state, self._runtime.soft, config.flag_z)
        return operator_pb2.ListStragglersResponse(
            generation=generation,
            ranks=[
                operator_pb2.StragglerRank(rank=r.rank, node_id=r.node_id, last_score=r.last_score,
                                           window_steps=r.window_steps, over_threshold=r.over_threshold,
                                           flagged=r.is_flagged)
                for r in ranks
            ],
            detections=[codec.record_to_proto(r) for r in self._digest.detections],
            flag_z=config.flag_z,
            flag_min_over=config.flag_min_over,
            window_steps=config.window_steps,
        )

    async def ListCheckpoints(
        self, request: operator_pb2.ListCheckpointsRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ListCheckpointsResponse:
        await self._digest.catch_up(self._runtime.event_log)
        state = self._runtime.state
        config = self._runtime.config
        response = operator_pb2.ListCheckpointsResponse(cadence=_cadence_text(config))
        if config.checkpoint_location:
            advice = self._runtime.checkpoint_advice()
            response.interval_s = advice.interval_s
            use = "used (auto)" if config.checkpoint_timing.is_auto else "advice only (the cadence is not auto)"
            response.interval_reason = f"{use}: {advice.reason}"
        else:
            response.interval_reason = NO_STORE_CADENCE
        requested = state.requested_checkpoint
        if requested is not None:
            response.requested_checkpoint_id = requested.checkpoint_id
            response.requested_step = requested.step
            response.requested_reason = requested.reason
        if state.snapshot is not None:
            response.snapshot_step = state.snapshot.step
            response.snapshot_generation = state.snapshot.generation
            seen = self._digest.snapshot_unix_s
            if seen is not None and seen[0] == state.snapshot.step:
                response.snapshot_unix_s = seen[1]
        if state.checkpoint is not None:
            response.checkpoint_id = state.checkpoint.checkpoint_id
            response.checkpoint_step = state.checkpoint.step
            response.checkpoint_manifest = state.checkpoint.manifest_key
            seen_ckpt = self._digest.checkpoint_unix_s
            if seen_ckpt is not None and seen_ckpt[0] == state.checkpoint.checkpoint_id:
                response.checkpoint_unix_s = seen_ckpt[1]
        pending = state.pending_checkpoint
        if pending is not None:
            response.pending_checkpoint_id = pending.checkpoint_id
            response.pending_step = pending.step
            response.pending_shards = pending.shards
            response.pending_written = len(pending.written)
        return response

    async def CheckpointNow(
        self, request: operator_pb2.JobCommandRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.CommandResponse:
        await require_reason(request.reason, context)
        # No store, no generation running, one in flight: admission refuses, saying which.
        outcome = await self._runtime.submit(
            OperatorRequest(OperatorCommandKind.CHECKPOINT, "", request.reason, request.operator or "unknown", principal()))
        if outcome.refusal is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, outcome.refusal)
        asked = next((r.event for r in outcome.records if isinstance(r.event, CheckpointRequested)), None)
        if asked is None:  # admission and decide agree; this is the guard if they ever do not
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no checkpoint was requested; nothing changed")
        assert asked is not None
        detail = (f"checkpoint {asked.checkpoint_id} requested: every rank saves at step {asked.step} of"
                  f" generation {asked.generation}; `supervisorctl checkpoints` shows its progress")
        log.info("operator command", command="checkpoint now", operator=request.operator, principal=principal(),
                 reason=request.reason,
                 checkpoint_id=asked.checkpoint_id, step=asked.step, generation=asked.generation)
        return operator_pb2.CommandResponse(detail=detail, seq=outcome.records[0].seq,
                                            checkpoint_id=asked.checkpoint_id, checkpoint_step=asked.step)

    async def Restart(
        self, request: operator_pb2.JobCommandRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.CommandResponse:
        await require_reason(request.reason, context)
        outcome = await self._runtime.submit(OperatorRequest(OperatorCommandKind.RESTART, "", request.reason, request.operator or "unknown",
                                                             principal()))
        if outcome.refusal is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, outcome.refusal)
        detail = ", ".join(type(r.event).__name__ for r in outcome.records)
        started = next((r.event for r in outcome.records if isinstance(r.event, GenerationStarted)), None)
        if started is not None:
            restore = started.restore_step
            detail += f"; generation {started.generation} restores " + (
                f"step {restore}" if restore is not None else "from step 0 (no committed snapshot)")
        else:
            detail += "; the next generation starts when enough nodes are healthy (see `supervisorctl status`)"
        log.info("operator command", command="restart", generation=self._runtime.generation_in_force,
                 operator=request.operator, principal=principal(), reason=request.reason, records=detail)
        return operator_pb2.CommandResponse(detail=detail, seq=outcome.records[0].seq if outcome.records else 0)
