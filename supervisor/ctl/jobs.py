"""supervisorctl's job-wide commands: goodput, stragglers, checkpoints, checkpoint now, restart,
and `events --at-step`. One function per command; rendering is in render_jobs.py (pure).
Each returns an exit code from main.py's table; gRPC errors are mapped there, in one place.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ftsup.supervisor.ctl import render_jobs
from ftsup.v1 import operator_pb2, operator_pb2_grpc

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

Stub = operator_pb2_grpc.OperatorStub


def _print_json(value: Any) -> None:
    print(json.dumps(value), flush=True)


def cmd_goodput(stub: Stub, args: argparse.Namespace) -> int:
    if getattr(args, "plot", None):
        from ftsup.supervisor.ctl import goodput_plot  # the core fold and codec: only this path needs them

        return goodput_plot.cmd_goodput_plot(stub, args)
    reply = stub.GetGoodput(operator_pb2.GetGoodputRequest(), timeout=args.timeout)
    if args.prometheus:
        job = stub.GetStatus(operator_pb2.GetStatusRequest(), timeout=args.timeout).job_name
        print(render_jobs.goodput_prometheus(reply, job))
    elif args.json:
        _print_json(render_jobs.goodput_dict(reply))
    else:
        print(render_jobs.goodput_text(reply))
    return EXIT_OK


def cmd_stragglers(stub: Stub, args: argparse.Namespace) -> int:
    reply = stub.ListStragglers(operator_pb2.ListStragglersRequest(), timeout=args.timeout)
    if args.json:
        _print_json(render_jobs.stragglers_dict(reply))
    else:
        print(render_jobs.stragglers_text(reply))
    return EXIT_OK


def cmd_checkpoints(stub: Stub, args: argparse.Namespace) -> int:
    reply = stub.ListCheckpoints(operator_pb2.ListCheckpointsRequest(), timeout=args.timeout)
    if args.json:
        _print_json(render_jobs.checkpoints_dict(reply))
    else:
        print(render_jobs.checkpoints_text(reply))
    return EXIT_OK


def cmd_job_command(stub: Stub, args: argparse.Namespace) -> int:
    """`restart` and `checkpoint now`: job-wide, admin-only, recorded with a reason."""
    name = "restart" if args.command == "restart" else "checkpoint now"
    call = stub.Restart if args.command == "restart" else stub.CheckpointNow
    response = call(operator_pb2.JobCommandRequest(reason=args.reason, operator=args.operator), timeout=args.timeout)
    result: dict[str, Any] = {"command": name, "seq": response.seq, "detail": response.detail}
    if response.checkpoint_id:
        result.update(checkpoint_id=response.checkpoint_id, step=response.checkpoint_step)
    if not args.json:
        print(f"{name}: {response.detail} (event seq {response.seq})", flush=True)
    code = EXIT_OK
    if response.checkpoint_id and getattr(args, "wait", False):
        outcome, why = _wait_for_checkpoint(stub, args, response.checkpoint_id, response.seq)
        result.update(outcome=outcome, outcome_detail=why)
        code = EXIT_OK if outcome == "committed" else EXIT_FAILED
        if not args.json:
            print(f"checkpoint {response.checkpoint_id}: {outcome}" + (f": {why}" if why else ""))
    if args.json:
        _print_json(result)
    return code


def _wait_for_checkpoint(stub: Stub, args: argparse.Namespace, checkpoint_id: str, since_seq: int) -> tuple[str, str]:
    """Polls until the requested checkpoint commits ("committed"), is aborted or withdrawn
    ("aborted", with the logged reason) or --wait-timeout passes ("timeout")."""
    deadline = time.monotonic() + args.wait_timeout
    while True:
        reply = stub.ListCheckpoints(operator_pb2.ListCheckpointsRequest(), timeout=args.timeout)
        if reply.checkpoint_id == checkpoint_id:
            return "committed", f"manifest {reply.checkpoint_manifest}"
        if checkpoint_id not in (reply.requested_checkpoint_id, reply.pending_checkpoint_id):
            request = operator_pb2.ListEventsRequest(since_seq=since_seq)
            reasons = [r.event.checkpoint_aborted.reason for r in stub.ListEvents(request, timeout=args.timeout)
                       if r.event.WhichOneof("kind") == "checkpoint_aborted"
                       and r.event.checkpoint_aborted.checkpoint_id == checkpoint_id]
            if reasons or reply.checkpoint_id > checkpoint_id:
                return "aborted", reasons[-1] if reasons else "a newer checkpoint committed instead"
        if time.monotonic() >= deadline:
            return "timeout", f"not committed within --wait-timeout {args.wait_timeout:g}s (still in flight)"
        time.sleep(0.5)


def cmd_at_step(stub: Stub, args: argparse.Namespace) -> int:
    """Which generation(s) ran step N, with their experiment record (config hash, code, data)."""
    if args.follow:
        print("supervisorctl events: --at-step reads the log as it is; drop --follow", file=sys.stderr)
        return EXIT_USAGE
    first_seq = stub.GetStatus(operator_pb2.GetStatusRequest(), timeout=args.timeout).first_seq
    stream = stub.ListEvents(operator_pb2.ListEventsRequest(since_seq=1), timeout=args.timeout)
    wanted = {"generation_started", "generation_ended", "snapshot_committed"}
    runs = render_jobs.runs_of_step((r for r in stream if r.event.WhichOneof("kind") in wanted), args.at_step)
    if args.json:
        _print_json(render_jobs.step_runs_dict(args.at_step, runs))
    else:
        print(render_jobs.step_runs_text(args.at_step, runs, first_seq))
    return EXIT_OK
