"""`ftsup run`: a torchrun-style script under ftsup on this machine, in one command.

Starts an embedded supervisor (file event log in the run directory, loopback, no TLS) and one
agent per node (`--local-nodes` simulates several, plus `--spares`) through LocalCluster, runs
the script as torchrun would (its environment, its argv, the user's cwd), shows every rank's
output live, and exits with the job's outcome. Multi-machine jobs keep the job file, the
supervisor and the agents (docs/run.md); `--dry-run` prints the job file this run is.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, TextIO

import grpc

from ftsup.harness.cluster import ClusterError, ClusterSpec, LocalCluster
from ftsup.harness.rank_output import RankOutput
from ftsup.harness.run_args import RunSpec, RunUsageError, job_dict, parse
from ftsup.supervisor.ctl import render
from ftsup.v1 import events_pb2, operator_pb2

EXIT_OK = 0
EXIT_JOB_FAILED = 1  # as torchrun's ChildFailedError
EXIT_USAGE = 2
EXIT_FTSUP = 3  # ftsup itself could not run the job (supervisor died, cluster did not start)
EXIT_INTERRUPTED = 130

POLL_S = 0.1
STATUS_EVERY_S = 0.5
_SHOWN_EVENTS = ("generation_started", "generation_ended", "node_declared_dead", "node_quarantined",
                 "job_failed", "job_completed", "xid_reported")


@dataclass(frozen=True, slots=True)
class Outcome:
    code: int
    phase: str
    run_dir: str
    restarts: int
    failure: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {"exit_code": self.code, "phase": self.phase, "run_dir": self.run_dir,
                "restarts": self.restarts, "failure": self.failure}


def say(text: str) -> None:
    print(f"[ftsup]: {text}", file=sys.stderr, flush=True)


def event_line(record: events_pb2.Record) -> str | None:
    """One line for the events a person running the job wants to see as they happen."""
    kind = record.event.WhichOneof("kind")
    if kind not in _SHOWN_EVENTS:
        return None
    event = getattr(record.event, kind)
    match kind:
        case "generation_started":
            return f"generation {event.generation} started (world {event.world_size}): {event.reason}"
        case "generation_ended":
            reason = events_pb2.EndReason.Name(event.reason).removeprefix("END_REASON_").lower()
            where = f" on {event.node_id}" if event.node_id else ""
            return f"generation {event.generation} ended: {reason}{where}: {event.detail}"
        case "job_failed":
            return None  # said once, with the output tail, at the end
        case _:
            detail = render.record_text(record).split(None, 3)[-1]
            return f"{kind}: {detail}"


def run(spec: RunSpec, run_dir: pathlib.Path) -> Outcome:
    job = job_dict(spec, os.getcwd())
    cluster = LocalCluster(
        ClusterSpec(nodes=spec.nnodes, spares=spec.spares, ranks_per_node=spec.nproc_per_node,
                    trainer_argv=spec.argv, job_name=spec.job_name, trainer_nice=0, is_isolated=False,
                    job_keys=tuple(job.items())),
        run_dir,
    )
    output = RankOutput(run_dir / "nodes", sys.stdout, pathlib.Path(spec.log_dir) if spec.log_dir else None)
    try:
        cluster.start()
        _write_run_file(cluster, run_dir)
        return _follow(cluster, output, run_dir)
    finally:
        output.finish()
        cluster.stop()


def _write_run_file(cluster: LocalCluster, run_dir: pathlib.Path) -> None:
    """run.json: where the supervisor listens (supervisorctl --address) and each node's process
    group (`kill -9 -PGID` rehearses losing that node)."""
    info = {"supervisor": cluster.address,
            "nodes": {n.node_id: {"role": n.role, "pgid": n.process.pid} for n in cluster.agents.values()}}
    (run_dir / "run.json").write_text(json.dumps(info, indent=2) + "\n")


def _follow(cluster: LocalCluster, output: RankOutput, run_dir: pathlib.Path) -> Outcome:
    with open(run_dir / "events.jsonl", "a") as events:
        return _follow_into(cluster, output, run_dir, events)


def _follow_into(cluster: LocalCluster, output: RankOutput, run_dir: pathlib.Path, events: TextIO) -> Outcome:
    """Until the job completes or fails: rank output, notable events on stderr, every event
    record (as `supervisorctl events --json` prints it) into events.jsonl, readable after the run."""
    next_seq = 1
    next_status = 0.0
    failure: dict[str, Any] | None = None
    while True:
        output.poll()
        if time.monotonic() < next_status:
            time.sleep(POLL_S)
            continue
        next_status = time.monotonic() + STATUS_EVERY_S
        if cluster.supervisor is not None and cluster.supervisor.poll() is not None:
            raise ClusterError(f"the supervisor exited with code {cluster.supervisor.returncode};"
                               f" see {run_dir / 'supervisor.log'}")
        try:
            records = cluster.events(next_seq)
            status = cluster.status()
        except grpc.RpcError as exc:
            say(f"supervisor not answering ({exc.code().name}); retrying")
            continue
        for record in records:
            next_seq = record.seq + 1
            events.write(json.dumps(render.record_dict(record)) + "\n")
            line = event_line(record)
            if line:
                say(line)
            if record.event.WhichOneof("kind") == "job_failed":
                failure = render.record_dict(record)
        events.flush()
        if status.phase == operator_pb2.JOB_PHASE_COMPLETED:
            output.finish()
            say(f"job completed after {status.restarts} restart(s); run dir {run_dir}")
            return Outcome(EXIT_OK, "completed", str(run_dir), status.restarts, None)
        if status.phase == operator_pb2.JOB_PHASE_FAILED:
            output.finish()
            say(status.failure)
            if status.failure_tail:
                say("last output of the failed rank:\n" + status.failure_tail)
            if failure is None:  # decided before this poll's events were read: read on
                continue
            say(f"run dir {run_dir}; every event in {run_dir / 'events.jsonl'}")
            return Outcome(EXIT_JOB_FAILED, "failed", str(run_dir), status.restarts, failure)


def main(argv: list[str] | None = None) -> int:
    try:
        spec = parse(sys.argv[1:] if argv is None else argv)
    except RunUsageError as exc:
        print(f"ftsup run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if spec.is_dry_run:
        print(json.dumps(job_dict(spec, os.getcwd()), indent=2))
        return EXIT_OK
    run_dir = pathlib.Path(spec.run_dir) if spec.run_dir else pathlib.Path(tempfile.mkdtemp(prefix="ftsup-run-"))
    run_dir = run_dir.resolve()
    if spec.run_dir and (run_dir / "supervisor").exists():
        print(f"ftsup run: {run_dir} already holds a run (its event log); give a new --run-dir", file=sys.stderr)
        return EXIT_USAGE
    say(f"run dir {run_dir}: {spec.nnodes} node(s) x {spec.nproc_per_node} rank(s), {spec.spares} spare(s),"
        f" max_restarts={spec.max_restarts}")

    try:  # SIGTERM/SIGHUP raise a KeyboardInterrupt here too (harness/stop_signals.py, set up by the CLI)
        outcome = run(spec, run_dir)
    except ClusterError as exc:
        say(f"ftsup could not run the job: {exc}")
        outcome = Outcome(EXIT_FTSUP, "error", str(run_dir), 0, {"detail": str(exc)})
    except KeyboardInterrupt:
        say(f"interrupted; ranks stopped, logs in {run_dir}")
        outcome = Outcome(EXIT_INTERRUPTED, "interrupted", str(run_dir), 0, None)
    if spec.is_json:
        print(json.dumps(outcome.as_dict()), flush=True)
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
