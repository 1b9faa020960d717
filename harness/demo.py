"""`ftsup demo`: a real local cluster trains a small GPT, loses a node, and finishes anyway.

Starts a supervisor and agents as processes on loopback, SIGKILLs one active node (its agent and
its ranks) at a chosen step, and follows detection, quarantine, the spare's promotion and the
restore from peers' RAM to the end of training. `--verify` trains the same job again without the
failure and compares final parameter digests bit for bit.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from ftsup.harness.cluster import ClusterError, ClusterSpec, LocalCluster
from ftsup.supervisor.ctl import render
from ftsup.v1 import events_pb2, operator_pb2

_RESTORED_FROM = {
    events_pb2.RESTORE_KIND_PEER_SNAPSHOT: "peer_snapshot",
    events_pb2.RESTORE_KIND_LOCAL_SNAPSHOT: "local_snapshot",
    events_pb2.RESTORE_KIND_CHECKPOINT: "checkpoint",
    events_pb2.RESTORE_KIND_FRESH: "fresh",
}


@dataclass
class Failure:
    kind: str
    node: str
    at_step: int
    killed_at: float
    detected_s: float | None = None
    resumed_s: float | None = None
    lost_steps: int | None = None
    restored_from: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node": self.node,
            "at_step": self.at_step,
            "detected_s": _round(self.detected_s),
            "resumed_s": _round(self.resumed_s),
            "lost_steps": self.lost_steps,
            "restored_from": self.restored_from,
        }


@dataclass
class RunResult:
    final_digest: str
    steps: int
    world_size: int
    started_at: float
    failures: list[Failure] = field(default_factory=list)
    records: list[events_pb2.Record] = field(default_factory=list)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def trainer_argv(python: str, steps: int, seed: int) -> tuple[str, ...]:
    return (python, "-m", "ftsup.trainer.examples.gpt", "--steps", str(steps), "--seed", str(seed))


def run_job(args: argparse.Namespace, workdir: pathlib.Path, *, kill: bool, say: Any) -> RunResult:
    spec = ClusterSpec(
        nodes=args.nodes,
        spares=args.spares,
        ranks_per_node=args.ranks_per_node,
        trainer_argv=trainer_argv(sys.executable, args.steps, args.seed),
        heartbeat_interval_s=args.heartbeat_interval_s,
        job_name="demo",
        warm_trainers=args.ranks_per_node if args.warm else 0,
    )
    started_at = time.time()
    failures: list[Failure] = []
    with LocalCluster(spec, workdir) as cluster:
        cluster.start()
        say(f"cluster up: supervisor {cluster.address}, {args.nodes} active + {args.spares} spare node(s), logs in {workdir}")
        progress = _Progress(say, started_at, args.steps)
        deadline = time.monotonic() + args.timeout_s
        while True:
            status = cluster.status()
            progress.show(status, cluster.nodes())
            if status.phase == operator_pb2.JOB_PHASE_COMPLETED:
                break
            if kill and not failures and status.phase == operator_pb2.JOB_PHASE_RUNNING and status.step >= args.kill_at:
                node = args.kill_node
                killed_at = cluster.kill_node(node)
                failures.append(Failure("node_kill", node, status.step, killed_at))
                say(f"*** SIGKILL node {node} (agent and its ranks) at step {status.step}")
            if time.monotonic() > deadline:
                raise ClusterError(f"the job did not complete within {args.timeout_s:g}s; logs in {workdir}")
            time.sleep(0.2)
        records = cluster.events()
        for failure in failures:
            measure_failure(failure, records)
        return RunResult(status.final_digest, status.step, status.world_size, started_at, failures, records)


def measure_failure(failure: Failure, records: list[events_pb2.Record]) -> None:
    """Fills a failure's figures from the event log: the supervisor's own timestamps."""
    in_force: events_pb2.GenerationStarted | None = None
    ended_last_step: int | None = None
    next_generation: events_pb2.GenerationStarted | None = None
    for record in records:
        kind = record.event.WhichOneof("kind")
        if kind is None:  # an event this build does not know (a newer writer's): nothing to measure
            continue
        body = getattr(record.event, kind)
        before_kill = record.time_unix_s <= failure.killed_at
        if kind == "generation_started":
            if before_kill:
                in_force = body
            elif next_generation is None and ended_last_step is not None:
                next_generation = body
                for restore in body.restores:
                    member = next((m for m in body.members if restore.rank in m.ranks), None)
                    if member is not None and failure.restored_from is None and restore.rank in _ranks_of(in_force, failure.node):
                        failure.restored_from = _RESTORED_FROM.get(restore.kind, "fresh")
                step = body.restore_step if body.HasField("restore_step") else 0
                failure.lost_steps = max(0, ended_last_step - step)
        elif kind == "generation_ended" and in_force is not None and body.generation == in_force.generation:
            ended_last_step = max(body.last_step, failure.at_step)
        elif kind == "node_declared_dead" and body.node_id == failure.node and failure.detected_s is None and not before_kill:
            failure.detected_s = record.time_unix_s - failure.killed_at
        elif (kind == "generation_running" and next_generation is not None
              and body.generation == next_generation.generation and failure.resumed_s is None):
            failure.resumed_s = record.time_unix_s - failure.killed_at


def _ranks_of(generation: events_pb2.GenerationStarted | None, node_id: str) -> set[int]:
    if generation is None:
        return set()
    return {r for m in generation.members if m.node_id == node_id for r in m.ranks}


class _Progress:
    """Live progress on stderr: one line whenever something a person cares about changed."""

    def __init__(self, say: Any, started_at: float, steps: int) -> None:
        self._say = say
        self._started_at = started_at
        self._steps = steps
        self._last = ""

    def show(self, status: operator_pb2.GetStatusResponse, nodes: list[operator_pb2.NodeInfo]) -> None:
        d = render.status_dict(status)
        loss = f"{d['loss']:.3f}" if d["loss"] is not None else "-"
        states = " ".join(
            f"{n['node_id']}={n['liveness']}{'/quarantined' if n['quarantined'] else ''}"
            f"{'(' + ','.join(map(str, n['ranks'])) + ')' if n['ranks'] else ''}"
            for n in (render.node_dict(x) for x in nodes)
        )
        line = f"gen {d['generation']} {d['phase']:<9} step {d['step']:>4}/{self._steps} loss {loss:>6} | {states}"
        if line != self._last:
            self._last = line
            self._say(f"[{time.time() - self._started_at:6.1f}s] {line}")


def timeline(result: RunResult) -> str:
    lines = ["timeline (seconds since start, from the supervisor's event log):"]
    snapshots = 0
    for record in result.records:
        kind = record.event.WhichOneof("kind")
        if kind == "snapshot_committed":
            snapshots += 1
            continue
        lines.append(f"  {record.time_unix_s - result.started_at:7.2f}s  " + render.record_text(record).split("  ", 2)[-1])
    lines.append(f"  ({snapshots} in-memory snapshot steps committed)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup demo", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=3, help="active nodes (default 3)")
    p.add_argument("--spares", type=int, default=1, help="hot spare nodes (default 1)")
    p.add_argument("--ranks-per-node", type=int, default=2, help="trainer ranks per node (default 2)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps to train (default 60)")
    p.add_argument("--kill-at", type=int, default=30, help="SIGKILL a node once this step is reached; 0: no failure")
    p.add_argument("--kill-node", default=None, help="node to kill (default: the last active node)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    p.add_argument("--workdir", type=pathlib.Path, default=None, help="where logs and state go (default: a new temp dir)")
    p.add_argument("--warm", action=argparse.BooleanOptionalAction, default=True,
                   help="agents keep pre-warmed trainer processes (default on; --no-warm for cold starts)")
    p.add_argument("--verify", action="store_true", help="also train without the failure and compare digests bit for bit")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress stays on stderr)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up on a run after this long")
    return p


def _validate(args: argparse.Namespace) -> str | None:
    if args.nodes < 2:
        return "--nodes must be at least 2 (a rank's buddy must be on another node)"
    if args.spares < 0 or args.ranks_per_node < 1 or args.steps < 1:
        return "--spares must be >= 0, --ranks-per-node and --steps >= 1"
    if args.kill_at < 0 or args.kill_at >= args.steps:
        return f"--kill-at must be within [0, {args.steps - 1}] (0 disables the failure)"
    if args.kill_at and args.spares < 1:
        return "a node kill needs at least one spare (--spares 1): shrinking is not supported yet"
    if args.kill_node is not None and not args.kill_node.startswith("node-"):
        return f"--kill-node must name an active node (node-1..node-{args.nodes}), got {args.kill_node!r}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problem = _validate(args)
    if problem:
        print(f"ftsup demo: {problem}", file=sys.stderr)
        return 2
    args.kill_node = args.kill_node or f"node-{args.nodes}"
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="ftsup-demo-"))

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    try:  # SIGTERM/SIGHUP raise a KeyboardInterrupt here too (harness/stop_signals.py, set up by the CLI)
        result = run_job(args, workdir / "run", kill=args.kill_at > 0, say=say)
        say(timeline(result))
        reference = None
        if args.verify:
            say("--verify: training the same job without the failure for a reference digest")
            reference = run_job(args, workdir / "reference", kill=False, say=say).final_digest
    except ClusterError as exc:
        say(f"ftsup demo: {exc}")
        return 1
    except KeyboardInterrupt:
        say(f"ftsup demo: interrupted; cluster stopped, logs in {workdir}")
        return 130
    match = None if reference is None else reference == result.final_digest
    report = {
        "steps": result.steps,
        "world_size": result.world_size,
        "failures": [f.as_dict() for f in result.failures],
        "final_digest": result.final_digest,
        "reference_digest": reference,
        "bitwise_match": match,
    }
    for f in result.failures:
        say(f"failure {f.kind} {f.node} at step {f.at_step}: detected in {f.detected_s:.2f}s, training resumed "
            f"{f.resumed_s:.2f}s after the kill, {f.lost_steps} step(s) lost, restored from {f.restored_from}"
            if f.detected_s is not None and f.resumed_s is not None else f"failure {f.kind} {f.node}: incomplete figures {f.as_dict()}")
    if match is not None:
        say(f"bitwise match with the uninterrupted run: {match} ({result.final_digest} vs {reference})")
    if args.json:
        print(json.dumps(report))
    else:
        say(f"final parameter digest {result.final_digest} after {result.steps} steps")
    return 0 if match is not False else 1
