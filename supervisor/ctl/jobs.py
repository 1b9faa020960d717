"""supervisorctl's job-wide commands: goodput, stragglers, checkpoints, checkpoint now, restart,
and `events --at-step`. One function per command; rendering is in render_jobs.py (pure).
Each returns an exit code from main.py's table; gRPC errors are mapped there, in one place.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ftsup.v1 import operator_pb2, operator_pb2_grpc
from supervisor.ctl import render_jobs

EXIT_OK = 0
EXIT_USAGE = 2

Stub = operator_pb2_grpc.OperatorStub


def _print_json(value: Any) -> None:
    print(json.dumps(value), flush=True)


def cmd_goodput(stub: Stub, args: argparse.Namespace) -> int:
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
    if args.json:
        _print_json({"command": name, "seq": response.seq, "detail": response.detail})
    else:
        print(f"{name}: {response.detail} (event seq {response.seq})")
    return EXIT_OK


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
