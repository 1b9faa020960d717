"""supervisorctl: the operator's view of a running ftsup supervisor, and its levers.

Human tables by default, `--json` for scripts. Exit codes are defined once here:
0 success, 1 the command failed (the supervisor refused it and said why), 2 bad usage,
3 the supervisor could not be reached, 4 not authorized.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import grpc

from ftsup.supervisor.ctl import auth, completion, jobs, logs, render, sdc_view, top
from ftsup.v1 import operator_pb2, operator_pb2_grpc

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_UNAUTHORIZED = 4
EXIT_JOB_FAILED = 5  # `status`: the job ended FAILED (its restart budget is spent)

DEFAULT_ADDRESS = "127.0.0.1:7070"


def exit_code_for(error: grpc.RpcError) -> int:
    code = error.code() if hasattr(error, "code") else None
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return EXIT_UNAVAILABLE
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
        return EXIT_USAGE
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return EXIT_UNAUTHORIZED
    return EXIT_FAILED


def _print_json(value: Any) -> None:
    print(json.dumps(value, sort_keys=False), flush=True)


def cmd_status(stub: operator_pb2_grpc.OperatorStub, args: argparse.Namespace) -> int:
    status = stub.GetStatus(operator_pb2.GetStatusRequest(), timeout=args.timeout)
    if args.json:
        _print_json(render.status_dict(status))
    else:
        print(render.status_text(status))
    return EXIT_JOB_FAILED if status.phase == operator_pb2.JOB_PHASE_FAILED else EXIT_OK


def cmd_nodes(stub: operator_pb2_grpc.OperatorStub, args: argparse.Namespace) -> int:
    nodes = stub.ListNodes(operator_pb2.ListNodesRequest(), timeout=args.timeout).nodes
    if args.json:
        _print_json({"nodes": [render.node_dict(n) for n in nodes]})
    else:
        print(render.nodes_text(nodes))
    return EXIT_OK


def cmd_events(stub: operator_pb2_grpc.OperatorStub, args: argparse.Namespace) -> int:
    if args.at_step is not None:
        return jobs.cmd_at_step(stub, args)
    request = operator_pb2.ListEventsRequest(since_seq=args.since, follow=args.follow)
    stream = stub.ListEvents(request, timeout=None if args.follow else args.timeout)

    def wanted(record: Any) -> bool:
        kind = record.event.WhichOneof("kind") or ""
        if args.kind and kind not in args.kind:
            return False
        if args.node:
            body = getattr(record.event, kind)
            node_ids = {getattr(body, "node_id", "")} | {m.node_id for m in getattr(body, "members", [])}
            return args.node in node_ids
        return True

    if args.json and not args.follow:
        _print_json({"events": [render.record_dict(r) for r in stream if wanted(r)]})
        return EXIT_OK
    try:
        for record in stream:
            if wanted(record):
                print(json.dumps(render.record_dict(record)) if args.json else render.record_text(record), flush=True)
    except KeyboardInterrupt:
        stream.cancel()
    return EXIT_OK


def cmd_sdc(stub: operator_pb2_grpc.OperatorStub, args: argparse.Namespace) -> int:
    """Checks, suspects and verdicts with their evidence, derived from the event log."""
    records = stub.ListEvents(operator_pb2.ListEventsRequest(since_seq=1, follow=False), timeout=args.timeout)
    view = sdc_view.sdc_dict(records)
    if args.json:
        _print_json(view)
    else:
        print(sdc_view.sdc_text(view))
    return EXIT_OK


def cmd_node_command(stub: operator_pb2_grpc.OperatorStub, args: argparse.Namespace) -> int:
    request = operator_pb2.NodeCommandRequest(node_id=args.node, reason=args.reason, operator=args.operator)
    call = {"quarantine": stub.Quarantine, "unquarantine": stub.Unquarantine, "drain": stub.Drain}[args.command]
    response = call(request, timeout=args.timeout)  # the token rides on the channel (ctl/auth.py)
    if args.json:
        _print_json({"command": args.command, "node_id": args.node, "seq": response.seq, "detail": response.detail})
    else:
        print(f"{args.command} {args.node}: {response.detail} (event seq {response.seq})")
    return EXIT_OK


MUTATING = ("quarantine", "unquarantine", "drain", "restart", "checkpoint")


def cmd_leader(addresses: list[str], args: argparse.Namespace) -> int:
    replicas = []
    for address in addresses:
        try:
            with auth.channel(address, args.credentials) as channel:
                reply = operator_pb2_grpc.OperatorStub(channel).GetLeader(
                    operator_pb2.GetLeaderRequest(), timeout=args.timeout)
            replicas.append({"address": address, "reachable": True, "is_leader": reply.is_leader,
                             "leader": reply.leader_address or None, "term": reply.term,
                             "applied_seq": reply.applied_seq, "head_seq": reply.head_seq,
                             "behind": max(0, reply.head_seq - reply.applied_seq), "backend": reply.backend})
        except grpc.RpcError as error:
            replicas.append({"address": address, "reachable": False, "error": error.code().name})
    leaders = [r for r in replicas if r.get("is_leader")]
    leader = leaders[0] if leaders else None
    if args.json:
        _print_json({"leader": leader["address"] if leader else None, "term": leader["term"] if leader else None,
                     "replicas": replicas})
    else:
        print(f"leader  {leader['address']} (term {leader['term']})" if leader else "leader  none (election under way?)")
        rows = [[str(r["address"]), "leader" if r.get("is_leader") else ("follower" if r["reachable"] else "unreachable"),
                 str(r.get("term", "-")), str(r.get("applied_seq", "-")), str(r.get("behind", "-"))] for r in replicas]
        print(render.table(["REPLICA", "ROLE", "TERM", "APPLIED", "BEHIND"], rows))
    if not any(r["reachable"] for r in replicas):
        return EXIT_UNAVAILABLE
    return EXIT_OK


class UntrustedRedirect(Exception):
    """A replica named a leader supervisorctl may not send its credentials to."""


def pick_replica(addresses: list[str], *, needs_leader: bool, timeout_s: float,
                 credentials: auth.Credentials = auth.Credentials(None, None)) -> str:
    """Any replica answers reads; commands that change something go to the leader.

    A replica's answer is not trusted to send our token elsewhere: without TLS (where the
    handshake proves the leader is a supervisor) the leader must be one of `addresses`."""
    for address in addresses:
        try:
            with auth.channel(address, credentials) as channel:
                reply = operator_pb2_grpc.OperatorStub(channel).GetLeader(
                    operator_pb2.GetLeaderRequest(), timeout=min(timeout_s, 2.0))
        except grpc.RpcError:
            continue
        if needs_leader and reply.leader_address:
            if credentials.tls is None and reply.leader_address not in addresses:
                raise UntrustedRedirect(
                    f"{address} names {reply.leader_address} as the leader, which is not in --address; without"
                    " TLS supervisorctl sends its token only to the replicas you list: add it to --address")
            return reply.leader_address
        return address
    return addresses[0]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="supervisorctl", description="Query and steer an ftsup supervisor.")
    p.add_argument("--address", default=os.environ.get("FTSUP_SUPERVISOR", DEFAULT_ADDRESS),
                   help=f"supervisor host:port, or every replica's, comma-separated (env FTSUP_SUPERVISOR,"
                        f" default {DEFAULT_ADDRESS})")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--token-file", default=os.environ.get("FTSUP_OPERATOR_TOKEN_FILE"),
                        help="operator bearer token, admin or read-only (env FTSUP_OPERATOR_TOKEN_FILE)")
    common.add_argument("--tls-cert", default=os.environ.get("FTSUP_TLS_CERT"),
                        help="operator client certificate for an mTLS supervisor (env FTSUP_TLS_CERT)")
    common.add_argument("--tls-key", default=os.environ.get("FTSUP_TLS_KEY"), help="its key (env FTSUP_TLS_KEY)")
    common.add_argument("--tls-ca", default=os.environ.get("FTSUP_TLS_CA"),
                        help="CA that signs the supervisor's certificate (env FTSUP_TLS_CA)")
    sub.add_parser("status", parents=[common], help="job, generation, step, world, leader, last snapshot and checkpoint, goodput")
    sub.add_parser("nodes", parents=[common], help="every node: role, state, ranks, last heartbeat, Xids, straggler score")
    sub.add_parser("leader", parents=[common], help="which replica leads, its term, each replica's applied seq")
    events = sub.add_parser("events", parents=[common], help="the event log (with --follow: live)")
    events.add_argument("--since", type=int, default=1, help="first seq to show (default 1)")
    events.add_argument("--follow", "-f", action="store_true", help="keep streaming new events")
    events.add_argument("--node", help="only events about this node")
    events.add_argument("--kind", action="append", help="only this event kind (repeatable), e.g. node_declared_dead")
    events.add_argument("--at-step", type=int, metavar="N",
                        help="which generation(s) ran step N, with config hash, code and data version")
    logs.add_parser(sub, common)
    goodput = sub.add_parser("goodput", parents=[common], help="effective training time ratio and where the rest went")
    goodput.add_argument("--prometheus", action="store_true", help="Prometheus text format (textfile collector)")
    goodput.add_argument("--plot", metavar="FILE.png", help="draw the breakdown over time from the event log (needs ftsup[plot])")
    sub.add_parser("stragglers", parents=[common], help="per-rank straggler scores and recent detections")
    sub.add_parser("checkpoints", parents=[common], help="committed RAM snapshot and object-store checkpoints")
    for name, text in (
        ("checkpoint", "`checkpoint now`: ask for an object-store checkpoint now (admin)"),
        ("restart", "end the running generation and restart from the newest committed snapshot (admin)"),
    ):
        command = sub.add_parser(name, parents=[common], help=text)
        if name == "checkpoint":
            command.add_argument("what", choices=["now"], help="now")
            command.add_argument("--wait", action="store_true",
                                 help="wait until it commits (exit 0) or is aborted / times out (exit 1)")
            command.add_argument("--wait-timeout", type=float, default=900.0, metavar="S",
                                 help="give up waiting after S seconds (default 900)")
        command.add_argument("--reason", required=True, help="why (recorded in the event log)")
        command.add_argument("--operator", default=os.environ.get("USER", ""), help="who asks (default $USER)")
    shells = sub.add_parser("completion", help="print a shell completion script: bash or zsh")
    shells.add_argument("shell", choices=["bash", "zsh"], help="which shell")
    shells.add_argument("--json", action="store_true", help="the commands and their flags as JSON instead")
    top.add_parser(sub, common)
    sub.add_parser("sdc", parents=[common], help="silent data corruption: checks run, suspects, verdicts, evidence")
    for name, text in (
        ("quarantine", "take a node out of service (its ranks move to a spare now)"),
        ("unquarantine", "return a quarantined or drained node to service"),
        ("drain", "move a healthy node's ranks to a spare at the next committed step"),
    ):
        command = sub.add_parser(name, parents=[common], help=text)
        command.add_argument("node", help="node id")
        command.add_argument("--reason", required=True, help="why (recorded in the event log)")
        command.add_argument("--operator", default=os.environ.get("USER", ""), help="who asks (default $USER)")
    return p


COMMANDS: dict[str, Callable[[operator_pb2_grpc.OperatorStub, argparse.Namespace], int]] = {
    "status": cmd_status,
    "nodes": cmd_nodes,
    "events": cmd_events,
    "logs": logs.cmd_logs,
    "sdc": cmd_sdc,
    "quarantine": cmd_node_command,
    "unquarantine": cmd_node_command,
    "drain": cmd_node_command,
    "goodput": jobs.cmd_goodput,
    "stragglers": jobs.cmd_stragglers,
    "checkpoints": jobs.cmd_checkpoints,
    "checkpoint": jobs.cmd_job_command,
    "restart": jobs.cmd_job_command,
    "top": top.cmd_top,
}


def cmd_completion(args: argparse.Namespace) -> int:
    """Needs no supervisor: the script is generated from this program's own parser."""
    if args.json:
        _print_json(completion.spec_dict(parser()))
    else:
        print(completion.bash_script(parser()) if args.shell == "bash" else completion.zsh_script(parser()), end="")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "completion":
        return cmd_completion(args)
    if args.timeout <= 0:
        print("supervisorctl: --timeout must be positive", file=sys.stderr)
        return EXIT_USAGE
    addresses = [a.strip() for a in args.address.split(",") if a.strip()]
    if not addresses:
        print("supervisorctl: --address names no supervisor", file=sys.stderr)
        return EXIT_USAGE
    try:
        args.credentials = auth.load(args.token_file, args.tls_cert, args.tls_key, args.tls_ca)
    except auth.CredentialsError as exc:
        print(f"supervisorctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "leader":
        return cmd_leader(addresses, args)
    try:
        target = pick_replica(addresses, needs_leader=args.command in MUTATING, timeout_s=args.timeout,
                              credentials=args.credentials) if len(addresses) > 1 else addresses[0]
    except UntrustedRedirect as exc:
        print(f"supervisorctl {args.command}: {exc}", file=sys.stderr)
        return EXIT_UNAUTHORIZED
    with auth.channel(target, args.credentials) as channel:
        stub = operator_pb2_grpc.OperatorStub(channel)
        try:
            return COMMANDS[args.command](stub, args)
        except grpc.RpcError as error:
            code = exit_code_for(error)
            hint = (
                f"cannot reach the supervisor at {target}: is it running? (set --address or FTSUP_SUPERVISOR)"
                if code == EXIT_UNAVAILABLE
                else error.details() if hasattr(error, "details") else str(error)
            )
            print(f"supervisorctl {args.command}: {hint}", file=sys.stderr)
            return code


if __name__ == "__main__":
    sys.exit(main())
