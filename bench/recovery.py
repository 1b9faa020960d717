"""Recovery from a node kill: ftsup (RAM snapshots, hot spare) versus torchrun + disk checkpoints.

ftsup: a real local cluster (supervisor, 4 agents x 2 ranks of trainer/examples/gpt.py, one hot
spare with pre-warmed trainers) loses one node (agent and ranks SIGKILLed) several times; after
each recovery a fresh spare agent joins (a replaced machine) before the next kill. Baseline in
the same run: the same model and data under `torchrun --max-restarts` (c10d rendezvous,
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, 8 workers) restoring a torch.save checkpoint written every
10 steps (bench/_torchrun_trainer.py); one rank's process group is SIGKILLed at the steps the
ftsup kills happened. For each kill, from rank 0's step log (polled every 50 ms): seconds from
the kill to the first step completed afterwards, steps lost, and the time to regain progress
(until the step completed at the kill is completed again). Medians; prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ftsup.bench import arguments
from ftsup.harness import orphan_guard
from ftsup.harness.cluster import ClusterError, ClusterSpec, LocalCluster, free_port
from ftsup.harness.demo import Failure, measure_failure, trainer_argv

POLL_S = 0.05
GOAL_RATIO = 0.3
GOAL_LOST_STEPS = 1
STEP_LINE = re.compile(rb"^step (\d+) ", re.MULTILINE)


class StepLog:
    """Steps completed per epoch (a generation, or a torchrun restart attempt), from rank 0's log
    lines `step N ...`, with the wall time each step was first seen."""

    def __init__(self, files: Callable[[], dict[int, pathlib.Path]]) -> None:
        self._files = files
        self._offsets: dict[pathlib.Path, int] = {}
        self.seen: dict[int, dict[int, float]] = {}

    def poll(self) -> None:
        now = time.time()
        for epoch, path in self._files().items():
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
            self._offsets[path] = offset + len(complete)
            steps = self.seen.setdefault(epoch, {})
            for match in STEP_LINE.finditer(complete):
                steps.setdefault(int(match.group(1)), now)

    def latest(self) -> tuple[int, int]:
        """(newest epoch with a step, its last step), (0, 0) before any step."""
        live = [e for e, steps in self.seen.items() if steps]
        if not live:
            return 0, 0
        epoch = max(live)
        return epoch, max(self.seen[epoch])


@dataclass
class Kill:
    victim: str
    trigger_step: int  # the step rank 0 had reported when the kill was sent
    killed_at: float
    epoch: int
    at_step: int | None = None  # the last step completed in the killed epoch
    first_step: int | None = None  # the first step completed after the kill
    recovery_s: float | None = None
    lost_steps: int | None = None
    regain_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def measure(self, log: StepLog) -> bool:
        """Fills the figures once the job has regained its progress; True when done."""
        later = sorted(e for e, steps in log.seen.items() if e > self.epoch and steps)
        if not later:
            return False
        steps = log.seen[later[0]]
        self.at_step = max(log.seen.get(self.epoch, {0: 0.0}))
        self.first_step = min(steps)
        target = max(self.at_step, self.first_step)
        if target not in steps:
            return False
        self.recovery_s = round(steps[self.first_step] - self.killed_at, 3)
        # A checkpoint saved just before its step line was printed can be newer than at_step: 0 lost.
        self.lost_steps = max(0, self.at_step - (self.first_step - 1))
        self.regain_s = round(steps[target] - self.killed_at, 3)
        return True

    def as_dict(self) -> dict[str, Any]:
        return {"victim": self.victim, "at_step": self.at_step, "first_step": self.first_step,
                "recovery_s": self.recovery_s, "lost_steps": self.lost_steps, "regain_s": self.regain_s, **self.extra}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def drive_kills(
    name: str,
    log: StepLog,
    triggers: list[int],
    kill: Callable[[int, int, int], Kill],
    ready: Callable[[], bool],
    after_regain: Callable[[Kill], None],
    timeout_s: float,
) -> list[Kill]:
    """Kills once per trigger step, each only once the previous kill was regained and `ready()`."""
    kills: list[Kill] = []
    deadline = time.monotonic() + timeout_s
    regained = 0
    while regained < len(triggers):
        if time.monotonic() > deadline:
            raise ClusterError(f"{name}: {regained} of {len(triggers)} kills regained when time ran out")
        log.poll()
        if len(kills) > regained:
            if kills[-1].measure(log):
                regained += 1
                k = kills[-1]
                _say(f"{name}: kill {regained} regained: recovery {k.recovery_s}s, regain {k.regain_s}s, "
                     f"{k.lost_steps} step(s) lost")
                after_regain(k)
                deadline = time.monotonic() + timeout_s
            else:
                time.sleep(POLL_S)
            continue
        epoch, step = log.latest()
        if step >= triggers[len(kills)] and ready():
            log.poll()
            epoch, step = log.latest()
            kills.append(kill(len(kills), epoch, step))
            _say(f"{name}: kill {len(kills)}: {kills[-1].victim} at step {step} (epoch {epoch})")
            continue
        time.sleep(POLL_S)
    return kills


# -- ftsup ------------------------------------------------------------------------------------


def group_cpu_s(pgid: int) -> float:
    """CPU seconds used so far by the live processes of a process group (from /proc)."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def warm_processes(pgids: set[int]) -> dict[int, tuple[int, float]]:
    """pid -> (group, CPU seconds) of the processes started as agent.warm_start in these groups
    (pool members, and trainers that began as one: they keep the command line)."""
    found: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if b"ftsup.agent.warm_start" not in f.read():
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in pgids:
            found[int(name)] = (int(fields[2]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return found


def wait_warm_pools(pgids: set[int], per_node: int, timeout_s: float) -> bool:
    """Waits until every agent's pool holds `per_node` warm processes, all idle (torch imported):
    a recovery is complete when the hot-spare capacity it used is back."""
    deadline = time.monotonic() + timeout_s
    before = warm_processes(pgids)
    while time.monotonic() < deadline:
        time.sleep(1.0)  # the measuring window, not a wait for something to happen
        now = warm_processes(pgids)
        idle = [group for pid, (group, cpu) in now.items() if pid in before and cpu - before[pid][1] < 0.05]
        if all(idle.count(group) >= per_node for group in pgids):  # busy ones are trainers now
            return True
        before = now
    return False


def wait_quiet(pgid: int, timeout_s: float, idle_cpu_s: float = 0.1) -> bool:
    """Waits until a process group used under `idle_cpu_s` of CPU in one second (warm-up done)."""
    deadline = time.monotonic() + timeout_s
    before = group_cpu_s(pgid)
    while time.monotonic() < deadline:
        time.sleep(1.0)  # the measuring window, not a wait for something to happen
        now = group_cpu_s(pgid)
        if now - before < idle_cpu_s:
            return True
        before = now
    return False


def run_ftsup(args: argparse.Namespace, workdir: pathlib.Path, triggers: list[int]) -> list[Kill]:
    rpn = args.ranks_per_node
    spec = ClusterSpec(nodes=args.nodes, spares=1, ranks_per_node=rpn, job_name="recovery-bench",
                       trainer_argv=trainer_argv(sys.executable, args.steps, 0), warm_trainers=rpn)

    def rank0_logs() -> dict[int, pathlib.Path]:
        found = {}
        for path in (workdir / "nodes").glob("*/rank-0.gen-*.log"):
            found[int(path.name.split(".gen-")[1].split(".")[0])] = path
        return found

    log = StepLog(rank0_logs)
    with LocalCluster(spec, workdir) as cluster:
        cluster.start()
        _say(f"ftsup: cluster up, {args.nodes} nodes x {rpn} ranks + 1 spare (warm), logs in {workdir}")
        spares = iter(range(2, 1000))
        pending_spare: list[str] = []
        kills: list[Kill] = []

        armed: list[bool] = [False]

        def ready() -> bool:
            """The previous recovery is complete: a new spare is up and every warm pool is full."""
            for node in cluster.agents.values():
                if not node.is_killed and node.process.poll() is not None:
                    raise ClusterError(f"agent {node.node_id} exited with {node.process.returncode}; see {node.log_path}")
            if armed[0]:
                return True
            if pending_spare:
                node_id = pending_spare[0]
                if not any(n.node_id == node_id and n.connected for n in cluster.nodes()):
                    return False
                wait_quiet(cluster.agents[node_id].process.pid, timeout_s=120)
            live = {n.process.pid for n in cluster.agents.values() if not n.is_killed}
            pools = wait_warm_pools(live, rpn, timeout_s=180)
            _say(f"ftsup: {len(live)} agents up, warm pools {'full' if pools else 'NOT full after 180 s'}; "
                 "arming the next kill")
            pending_spare.clear()
            armed[0] = True
            return True

        def kill(index: int, epoch: int, step: int) -> Kill:
            armed[0] = False
            block = args.nodes - 1 - index % (args.nodes - 1)  # never rank 0's node
            holders = [n.node_id for n in cluster.nodes() if n.ranks and min(n.ranks) == block * rpn]
            if not holders:
                raise ClusterError(f"no node holds ranks {block * rpn}.. at kill {index + 1}; see {workdir}")
            victim = holders[0]
            killed_at = cluster.kill_node(victim)
            return Kill(victim, step, killed_at, epoch)

        def after_regain(done: Kill) -> None:
            kills.append(done)
            if len(kills) < len(triggers):  # a replaced machine joins as the next spare
                node_id = f"spare-{next(spares)}"
                cluster.start_agent(node_id, "spare")
                pending_spare.append(node_id)

        drive_kills("ftsup", log, triggers, kill, ready, after_regain, args.timeout_s)
        records = cluster.events()
    for k in kills:
        failure = Failure("node_kill", k.victim, k.trigger_step, k.killed_at)
        measure_failure(failure, records)
        k.extra = {"detected_s": failure.detected_s and round(failure.detected_s, 3),
                   "restored_from": failure.restored_from}
    return kills


# -- torchrun -------------------------------------------------------------------------------


def run_torchrun(args: argparse.Namespace, workdir: pathlib.Path, triggers: list[int]) -> list[Kill]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tmp").mkdir(exist_ok=True)
    rpn, world = args.ranks_per_node, args.nodes * args.ranks_per_node
    script = pathlib.Path(__file__).with_name("_torchrun_trainer.py")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
            "--max-restarts", str(len(triggers) + 2), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "recovery-bench",
            str(script), "--steps", str(args.steps), "--checkpoint-every", str(args.checkpoint_every),
            "--dir", str(workdir)]
    repo = str(pathlib.Path(__file__).resolve().parents[1])
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1",
           "TMPDIR": str(workdir / "tmp"), "PYTHONPATH": repo, "PYTHONUNBUFFERED": "1"}
    log = StepLog(lambda: {int(p.stem.split("-")[1]): p for p in workdir.glob("progress-*.log")})
    with open(workdir / "torchrun.log", "ab") as out:
        # Niced like ftsup's trainers (ClusterSpec.trainer_nice): both share the cores the same way.
        process = subprocess.Popen(["nice", "-n", "10", *argv], stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True, cwd=repo)
    orphan_guard.watch(process)
    _say(f"torchrun: {world} workers, checkpoint every {args.checkpoint_every} steps, logs in {workdir}")
    try:
        def kill(index: int, epoch: int, step: int) -> Kill:
            block = args.nodes - 1 - index % (args.nodes - 1)
            rank = block * rpn
            pid = int((workdir / "pids" / f"rank-{rank}").read_text())
            killed_at = time.time()
            os.killpg(pid, signal.SIGKILL)  # torchrun starts each worker in its own session
            return Kill(f"rank {rank}", step, killed_at, epoch)

        def ready() -> bool:
            if process.poll() is not None:
                raise ClusterError(f"torchrun exited with {process.returncode}; see {workdir / 'torchrun.log'}")
            return True

        return drive_kills("torchrun", log, triggers, kill, ready, lambda _kill: None, args.timeout_s)
    finally:
        _stop_torchrun(process, workdir)


def _stop_torchrun(process: subprocess.Popen[bytes], workdir: pathlib.Path) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)  # the elastic agent stops its workers on SIGTERM
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    for pid_file in (workdir / "pids").glob("rank-*"):
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)  # a worker left behind


# -- report ---------------------------------------------------------------------------------


def summarize(ours: list[Kill], theirs: list[Kill], args: argparse.Namespace) -> dict[str, Any]:
    def med(kills: list[Kill], name: str) -> float:
        return round(statistics.median(getattr(k, name) for k in kills), 3)

    result: dict[str, Any] = {
        "nodes": args.nodes,
        "ranks_per_node": args.ranks_per_node,
        "kills": len(ours),
        "ftsup_recovery_s": med(ours, "recovery_s"),
        "torchrun_recovery_s": med(theirs, "recovery_s"),
        "ftsup_lost_steps": med(ours, "lost_steps"),
        "torchrun_lost_steps": med(theirs, "lost_steps"),
        "ftsup_max_lost_steps": max(k.lost_steps or 0 for k in ours),
        "ftsup_regain_s": med(ours, "regain_s"),
        "torchrun_regain_s": med(theirs, "regain_s"),
        "ftsup_kills": [k.as_dict() for k in ours],
        "torchrun_kills": [k.as_dict() for k in theirs],
        "baseline": {
            "name": (f"torchrun --max-restarts, c10d rendezvous, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, "
                     f"torch.save checkpoint every {args.checkpoint_every} steps; one rank's process group SIGKILLed"),
        },
        "what": ("recovery_s: kill -> first step completed afterwards; lost_steps: last step completed before the "
                 "kill - step restored; regain_s: kill -> that last step completed again (the first step after the "
                 "restart when nothing was lost); from rank 0's step log polled every 50 ms; trainers niced 10 in both"),
        "goal": {"recovery_ratio": GOAL_RATIO, "ftsup_lost_steps": GOAL_LOST_STEPS},
    }
    result["recovery_ratio"] = round(result["ftsup_regain_s"] / result["torchrun_regain_s"], 3)
    result["goal_met"] = result["recovery_ratio"] <= GOAL_RATIO and result["ftsup_max_lost_steps"] <= GOAL_LOST_STEPS
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench recovery", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--kills", type=int, default=5, help="kills per system (default 5)")
    parser.add_argument("--first-kill", type=int, default=25, help="step of the first kill (default 25)")
    parser.add_argument("--kill-gap", type=int, default=30, help="steps between kills, at least (default 30)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="torchrun baseline's checkpoint interval")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per kill")
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="2 nodes x 1 rank, one kill each: for tests")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.ranks_per_node, args.kills, args.first_kill, args.kill_gap = 2, 1, 1, 13, 11
    if args.nodes < 2 or args.ranks_per_node < 1 or args.kills < 1 or args.first_kill < 2 or args.kill_gap <= args.checkpoint_every:
        parser.error(f"need --nodes >= 2, --kills >= 1, --first-kill >= 2 and --kill-gap > --checkpoint-every "
                     f"(got {args.nodes}, {args.kills}, {args.first_kill}, {args.kill_gap} vs {args.checkpoint_every})")
    triggers = [args.first_kill + i * args.kill_gap for i in range(args.kills)]
    # Far more steps than the kills need (a kill waits for the previous recovery, warm pools
    # included): the runs are stopped after the last regain, never left to finish.
    args.steps = triggers[-1] + 1000 * args.kill_gap

    workdir = arguments.run_directory("ftsup-bench-recovery-", args.dir)
    try:
        ours = run_ftsup(args, workdir / "ftsup", triggers)
        # The baseline is killed at the steps the ftsup kills happened (they wait for a spare).
        theirs = run_torchrun(args, workdir / "torchrun", [k.trigger_step for k in ours])
    except ClusterError as exc:
        _say(f"ftsup bench recovery: {exc} (logs kept in {workdir})")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(summarize(ours, theirs, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
