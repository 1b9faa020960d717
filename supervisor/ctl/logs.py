"""`supervisorctl logs`: a rank's output, relayed by the supervisor from the agent that runs it.

Text mode prints the lines as the rank wrote them (notes about skipped output and the process's
end go to stderr, so stdout stays the rank's own). `--json` prints one object: the lines; with
`--follow`, one object per message as it arrives (JSON lines). Ctrl-C ends a follow cleanly: the
cancellation reaches the agent, which stops reading.
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc

from ftsup.v1 import operator_pb2, operator_pb2_grpc, peer_pb2

EXIT_OK = 0
EXIT_FAILED = 1
AGENT_ERROR = "from the node's agent:"  # the supervisor's prefix for an error the agent answered


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    logs = sub.add_parser("logs", parents=[common], help="a rank's output (stdout and stderr), with --follow: live")
    logs.add_argument("--rank", type=int, help="global rank (default: the --node's only rank)")
    logs.add_argument("--node", help="node that ran it (default: the node running --rank now)")
    logs.add_argument("--generation", type=int, default=0,
                      help="generation (default: the one in force; with --node, else that node's newest)")
    logs.add_argument("--lines", "-n", type=int, default=100, help="last lines to show first (default 100, at most 10000)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing new output until the rank's process ends (or Ctrl-C)")


def message_dict(message: peer_pb2.LogLines) -> dict[str, object]:
    return {"node_id": message.node_id, "rank": message.rank, "generation": message.generation,
            "lines": list(message.lines), "ended": message.ended, "skipped_bytes": message.skipped_bytes}


def cmd_logs(stub: operator_pb2_grpc.OperatorStub, args: argparse.Namespace) -> int:
    try:
        return _logs(stub, args)
    except grpc.RpcError as error:
        details = error.details() if hasattr(error, "details") else ""
        if details and details.startswith(AGENT_ERROR):  # the supervisor answered: the agent did not
            print(f"supervisorctl logs: {details}", file=sys.stderr)
            return EXIT_FAILED
        raise


def _logs(stub: operator_pb2_grpc.OperatorStub, args: argparse.Namespace) -> int:
    if (args.rank is not None and args.rank < 0) or args.lines < 0 or args.generation < 0:
        print("supervisorctl logs: --rank, --lines and --generation must not be negative", file=sys.stderr)
        return 2
    request = operator_pb2.StreamLogsRequest(node_id=args.node or "", generation=args.generation,
                                             lines=args.lines, follow=args.follow)
    if args.rank is not None:
        request.rank = args.rank
    stream = stub.StreamLogs(request, timeout=None if args.follow else args.timeout)
    if args.json and not args.follow:
        messages = list(stream)
        first = messages[0] if messages else None
        print(json.dumps({"node_id": first.node_id if first else args.node, "rank": first.rank if first else args.rank,
                          "generation": first.generation if first else args.generation,
                          "lines": [line for m in messages for line in m.lines],
                          "skipped_bytes": sum(m.skipped_bytes for m in messages)}), flush=True)
        return EXIT_OK
    try:
        for message in stream:
            if args.json:
                print(json.dumps(message_dict(message)), flush=True)
                continue
            if message.skipped_bytes:
                print(f"[supervisorctl: {message.skipped_bytes} bytes of output skipped: it came faster than it was"
                      " read]", file=sys.stderr, flush=True)
            for line in message.lines:
                print(line, flush=False)
            sys.stdout.flush()
            if message.ended:
                print(f"[supervisorctl: rank {message.rank}'s process (generation {message.generation}, node"
                      f" {message.node_id}) has exited]", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        stream.cancel()
    return EXIT_OK
