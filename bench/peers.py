"""Recovery from a node kill, side by side: ftsup against torchft, NVRx, DLRover and torchrun.

Every tool trains the same model and data (the example GPT of trainer/examples/gpt.py, its
defaults) at the same world (2 simulated nodes x 2 ranks, gloo on CPU) for `--steps` steps, once
without a failure and `--repeats` times with one SIGKILL of a node at `--kill-at` (see
docs/peers.md for how each tool is configured and what "a node" is to it), in rounds: round 0
runs every tool failure-free, round r every tool's r-th kill and plain DDP failure-free again, so
the baseline is measured beside every tool through the machine's load drift (`plan_runs`). Per tool, from rank
0's step log: seconds from the kill to the first step completed after it (`recovery_s`), steps
lost, seconds until the step completed at the kill is completed again (`regain_s`, the headline),
wall time lost against the same tool's failure-free run (`goodput_lost_s`), the steady-state
seconds per step against the median of plain DDP's (`overhead_pct`), and the peak of the summed RSS of the tool's
processes. torchft keeps training with the survivors: `full_world_s` (kill -> first step with every
replica group back) and `reduced_step_s` (seconds per step meanwhile). The peers run from their
own venv (`--peers-python`, made with `pip install -e '.[bench-peers]'` in a copy of ours).
Prints one JSON object.
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
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ftsup.bench import arguments
from ftsup.harness import orphan_guard

TOOLS = ("plain", "torchrun", "torchft", "nvrx", "nvrx-inprocess", "dlrover", "ftsup-run", "ftsup")
PEERS = ("torchrun", "torchft", "nvrx", "nvrx-inprocess", "dlrover")
NEEDS_PEERS_VENV = ("torchft", "nvrx", "nvrx-inprocess", "dlrover")
PEER_MODULES = {"torchft": "torchft", "nvrx": "nvidia_resiliency_ext", "nvrx-inprocess": "nvidia_resiliency_ext",
                "dlrover": "dlrover"}
PEER_PACKAGES = {"torchft": "torchft-nightly", "nvrx": "nvidia-resiliency-ext",
                 "nvrx-inprocess": "nvidia-resiliency-ext", "dlrover": "dlrover", "torchrun": "torch"}
FIGURES = ("recovery_s", "lost_steps", "regain_s", "goodput_lost_s", "step_s", "overhead_pct", "peak_rss_mib",
           "full_world_s", "reduced_step_s", "samples_lost_steps")
GOAL = {"regain_ratio": 0.5, "lost_steps": 1, "overhead_pp": 1.0}
POLL_S = 0.05
LINE = re.compile(rb"^step (\d+)(?: loss \S+)?(?: world (\d+) t ([0-9.]+))?", re.MULTILINE)
INSTALL_HINT = ("cp -a .venv .venv-peers && .venv/bin/python -c "
                "\"import torch; print('torch==' + torch.__version__)\" > torch-pin.txt && "
                ".venv-peers/bin/python -m pip install -c torch-pin.txt -e '.[bench-peers]'")


# -- pure: records and figures -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step rank 0 completed: in which attempt (restart count or generation), when, at what world."""

    epoch: int
    step: int
    t: float
    world: int | None = None


def parse_lines(epoch: int, chunk: bytes, seen_at: float) -> list[StepRecord]:
    """`step N [world W t T]` lines; without T the time the line was seen stands in."""
    out = []
    for m in LINE.finditer(chunk):
        world = int(m.group(2)) if m.group(2) else None
        t = float(m.group(3)) if m.group(3) else seen_at
        out.append(StepRecord(epoch, int(m.group(1)), t, world))
    return out


def measure_kill(records: list[StepRecord], killed_at: float, full_world: int | None,
                 continuous: bool) -> dict[str, float | None]:
    """Figures of one kill. A restarting tool's first step after the kill is the first of a later
    epoch (a step the old attempt finished as the kill landed is not a recovery); a tool that keeps
    training (`continuous`) counts any later step, and `full_world_s`/`reduced_step_s` say when the
    whole world was back and how fast it went meanwhile."""
    before = [r for r in records if r.t <= killed_at]
    if not before:
        raise ValueError(f"no step completed before the kill at {killed_at}")
    last = max(before, key=lambda r: r.t)
    at_step = max(r.step for r in before if r.epoch == last.epoch)
    after = sorted((r for r in records if r.t > killed_at and (continuous or r.epoch > last.epoch)),
                   key=lambda r: r.t)
    if not after:
        return {"at_step": at_step, "recovery_s": None, "lost_steps": None, "regain_s": None}
    first = after[0]
    regained = next((r for r in after if r.step >= at_step), None)
    out: dict[str, float | None] = {
        "at_step": at_step, "first_step": first.step,
        "recovery_s": round(first.t - killed_at, 3),
        "lost_steps": max(0, at_step - first.step + 1),
        "regain_s": round(regained.t - killed_at, 3) if regained else None,
    }
    if continuous and full_world is not None:
        reduced = [r for r in after if r.world is not None and r.world < full_world]
        back = next((r for r in after if reduced and r.t > reduced[0].t and r.world == full_world), None)
        out["full_world_s"] = (round(back.t - killed_at, 3) if back else None) if reduced else out["recovery_s"]
        if reduced and back is None:  # the run ended first: a lower bound
            out["full_world_after_s"] = round(after[-1].t - killed_at, 3)
        out["reduced_steps"] = len(reduced)
        # A step at half the world trains on half the samples: the data left out, in full steps.
        out["samples_lost_steps"] = round(sum((full_world - r.world) / full_world for r in reduced if r.world), 1)
        out["reduced_step_s"] = (round((reduced[-1].t - reduced[0].t) / (len(reduced) - 1), 4)
                                 if len(reduced) > 1 else None)
    return out


def run_span_s(records: list[StepRecord], steps: int) -> float | None:
    """Seconds from the first completion of step 1 to the last step's completion (start-up excluded)."""
    ones = [r.t for r in records if r.step == 1]
    ends = [r.t for r in records if r.step >= steps]
    return round(min(ends) - min(ones), 3) if ones and ends else None


def steady_step_s(records: list[StepRecord], skip: int, full_world: int | None = None) -> float | None:
    """Seconds per step over one attempt's steps after `skip` (warm-up), at the full world: the
    span divided by the steps in it, so a 50 ms poll only blurs the two ends."""
    best: float | None = None
    for epoch in {r.epoch for r in records}:
        run = sorted((r for r in records if r.epoch == epoch and r.step > skip
                      and (full_world is None or r.world in (None, full_world))), key=lambda r: r.step)
        if len(run) >= 2 and run[-1].step > run[0].step:
            value = (run[-1].t - run[0].t) / (run[-1].step - run[0].step)
            best = value if best is None else min(best, value)
    return round(best, 4) if best is not None else None


def spread(values: list[float | None]) -> dict[str, Any] | None:
    got = [v for v in values if v is not None]
    if not got:
        return None
    return {"median": round(statistics.median(got), 4), "min": round(min(got), 4), "max": round(max(got), 4),
            "n": len(got), "missing": len(values) - len(got)}


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """One run of the bench: which tool, in which round, failure-free or with a kill (and which)."""

    round: int
    tool: str
    kill: bool
    index: int  # 1-based: the tool's n-th run of this kind

    @property
    def name(self) -> str:
        """The run's folder under the tool's: `clean` (then `clean-2`, ... for plain DDP), `kill-N`."""
        if self.kill:
            return f"kill-{self.index}"
        return "clean" if self.index == 1 else f"clean-{self.index}"


def plan_runs(tools: list[str], repeats: int) -> list[PlannedRun]:
    """Every run of the bench in order, round-robin so that a shared machine's load drift hits
    every tool alike: round 0 is each tool's failure-free run, round r (1..repeats) each tool's
    r-th kill, and plain DDP, the overhead baseline, runs failure-free in every round (so it has
    as many steady-state samples as any other tool, taken beside theirs). Plain leads round 0 (the
    other tools' figures need its baseline); from then on each round starts one tool further on,
    so no tool always runs right after another's teardown."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    order = ["plain", *[t for t in tools if t != "plain"]] if "plain" in tools else list(tools)
    runs = [PlannedRun(0, tool, False, 1) for tool in order]
    for r in range(1, repeats + 1):
        shift = r % len(order)
        for tool in order[shift:] + order[:shift]:
            runs.append(PlannedRun(r, tool, tool != "plain", r + 1 if tool == "plain" else r))
    return runs


def baseline_step_s(plain_runs: list[dict[str, Any]]) -> float | None:
    """Plain DDP's steady-state seconds per step: the median over its failure-free runs (one
    slow run, a load spike, does not move it as a single run's figure would)."""
    got = [r["step_s"] for r in plain_runs if r.get("step_s")]
    return round(statistics.median(got), 4) if got else None


def overhead_pct(step_s: float | None, plain_step_s: float | None) -> float | None:
    """A steady-state step's excess over plain DDP's, in percent (None when either is unknown)."""
    if not step_s or not plain_step_s:
        return None
    return round(100.0 * (step_s / plain_step_s - 1.0), 2)


def aggregate(tool: str, clean: dict[str, Any], kills: list[dict[str, Any]], plain_step_s: float | None,
              more_clean: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One tool's figures: per-kill figures as median and spread, plus its failure-free runs'
    (`clean`, and for plain DDP the rounds' further ones in `more_clean`)."""
    cleans = [clean, *(more_clean or [])]
    figures: dict[str, Any] = {}
    for name in ("recovery_s", "lost_steps", "regain_s", "full_world_s", "reduced_step_s", "samples_lost_steps",
                 "goodput_lost_s"):
        values = [k.get(name) for k in kills]
        if any(v is not None for v in values):
            figures[name] = spread(values)
    # Steady state: the failure-free runs and each run's steps before its kill (a shared machine's
    # load moves; more samples, and the median, keep one slow stretch from deciding).
    samples = [*(c.get("step_s") for c in cleans), *(k.get("step_s") for k in kills)]
    figures["step_s"] = spread(samples)
    if plain_step_s:
        figures["overhead_pct"] = spread([overhead_pct(v, plain_step_s) for v in samples])
    figures["peak_rss_mib"] = spread([*(c.get("peak_rss_mib") for c in cleans), *(k.get("peak_rss_mib") for k in kills)])
    out = {"figures": figures, "kills": kills, "clean": clean}
    if more_clean:
        out["clean_runs"] = cleans
    return out


def ratios(tools: dict[str, dict[str, Any]], ours: str = "ftsup") -> dict[str, Any]:
    """ftsup's median over the best peer's median, per figure (below 1: ftsup is better); the peer
    named. Overhead is a difference in percentage points, not a ratio (it can be 0 or negative)."""
    out: dict[str, Any] = {}
    mine = tools.get(ours, {}).get("figures", {})
    for name in FIGURES:
        if name not in mine or mine[name] is None:
            continue
        peers = {p: tools[p]["figures"][name]["median"] for p in PEERS
                 if p in tools and tools[p].get("figures", {}).get(name)}
        if not peers:
            continue
        best = min(peers, key=lambda p: peers[p])
        value = mine[name]["median"]
        if name == "overhead_pct":
            out[name] = {"best_peer": best, "peer": peers[best], "ftsup": value,
                         "difference_pp": round(value - peers[best], 2)}
        else:
            out[name] = {"best_peer": best, "peer": peers[best], "ftsup": value,
                         "ratio": round(value / peers[best], 3) if peers[best] else None}
    return out


def goals(tools: dict[str, dict[str, Any]], rat: dict[str, Any]) -> dict[str, Any]:
    mine = tools.get("ftsup", {}).get("figures", {})
    regain = rat.get("regain_s", {}).get("ratio")
    lost = (mine.get("lost_steps") or {}).get("max")
    over = rat.get("overhead_pct", {}).get("difference_pp")
    return {"regain_ratio": regain, "regain_goal_met": regain is not None and regain <= GOAL["regain_ratio"],
            "max_lost_steps": lost, "lost_goal_met": lost is not None and lost <= GOAL["lost_steps"],
            "overhead_difference_pp": over, "overhead_goal_met": over is not None and over <= GOAL["overhead_pp"],
            "goal": GOAL}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ftsup bench peers", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(TOOLS)} (default all)")
    p.add_argument("--repeats", type=int, default=5, help="kills per tool, each in a fresh run (default 5)")
    p.add_argument("--steps", type=int, default=60, help="steps per run (default 60)")
    p.add_argument("--kill-at", type=int, default=35,
                   help="the step at which a node is killed (default 35: mid-way between disk checkpoints)")
    p.add_argument("--checkpoint-every", type=int, default=10,
                   help="disk checkpoint interval of torchrun, ftsup run (Level 0), NVRx and DLRover's disk copy")
    p.add_argument("--warmup-steps", type=int, default=5, help="steps left out of the steady-state figure")
    p.add_argument("--ftsup-snapshot-every", default="auto",
                   help="ftsup Level 2's RAM snapshot cadence, passed to the example trainer: 'auto' (the library's"
                        " default: about one second of training between snapshots) or N steps (1: every step)")
    p.add_argument("--ftsup-grad-sync", choices=("deterministic", "allreduce"), default="deterministic",
                   help="ftsup Level 2's gradient sync, passed to the example trainer: 'deterministic' (its default:"
                        " the layout-independent comm hook, bit-exact restarts) or 'allreduce' (DDP's own, as every"
                        " peer runs; restarts correct within float tolerance)")
    p.add_argument("--nvrx-gloo-timeout-s", type=float, default=10.0,
                   help="nvrx-inprocess: the gloo group's timeout, which bounds its restart when a survivor is"
                        " blocked in a collective (gloo has no abort). Default 10: NVRx's examples on CPU")
    p.add_argument("--peers-python", type=pathlib.Path, default=None,
                   help="python of the venv with the peers installed (default: .venv-peers/bin/python beside ours)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per run")
    p.add_argument("--dir", type=pathlib.Path, default=None, help="work directory (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs of every run)")
    args = p.parse_args(argv)
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown or not tools:
        p.error(f"--tools: unknown {unknown or 'empty list'}; known: {', '.join(TOOLS)}")
    if args.repeats < 1 or args.steps < 10 or not args.warmup_steps < args.kill_at < args.steps:
        p.error(f"need --repeats >= 1, --steps >= 10 and --warmup-steps < --kill-at < --steps "
                f"(got {args.repeats}, {args.steps}, {args.warmup_steps} < {args.kill_at} < {args.steps})")
    if args.ftsup_snapshot_every != "auto" and not args.ftsup_snapshot_every.isdigit():
        p.error(f"--ftsup-snapshot-every must be 'auto' or a step count, got {args.ftsup_snapshot_every!r}")
    if args.nvrx_gloo_timeout_s <= 0:
        p.error(f"--nvrx-gloo-timeout-s must be > 0 (got {args.nvrx_gloo_timeout_s})")
    if args.checkpoint_every < 1:
        p.error(f"--checkpoint-every must be >= 1 (got {args.checkpoint_every})")
    args.tools = tools
    if args.peers_python is None:
        args.peers_python = pathlib.Path(sys.prefix).parent / ".venv-peers" / "bin" / "python"
    return args


# -- I/O: processes, progress, memory ----------------------------------------------------------


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Progress:
    """Rank 0's step lines from `progress-<epoch>.log` files (or any files a callable names)."""

    def __init__(self, files: Callable[[], dict[int, pathlib.Path]]) -> None:
        self._files = files
        self._offsets: dict[pathlib.Path, int] = {}
        self.records: list[StepRecord] = []

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
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._offsets[path] = offset + len(complete)
            self.records.extend(parse_lines(epoch, complete, now))

    def latest_step(self) -> int:
        return max((r.step for r in self.records), default=0)


def progress_files(directory: pathlib.Path) -> Callable[[], dict[int, pathlib.Path]]:
    return lambda: {int(p.stem.split("-")[1]): p for p in directory.glob("progress-*.log")}


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def rss_bytes(pids: list[int]) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def pids_naming(text: str) -> list[int]:
    """Processes with `text` (a run's directory) as one of their arguments: what a tool started that
    left this process's tree, such as NVRx's in-process monitor daemons (double-forked, own session)."""
    needle = text.encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:
            continue
    return out


@contextlib.contextmanager
def peak_rss(period_s: float = 0.5, also: str | None = None) -> Iterator[list[int]]:
    """Samples the summed RSS of this process's descendants (the tool under test: tools run one at
    a time), plus processes naming `also` outside that tree; yields a one-element list holding the
    peak in bytes."""
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(period_s):
            pids = set(_descendants(os.getpid()))
            if also is not None:
                pids.update(pids_naming(also))
            peak[0] = max(peak[0], rss_bytes(sorted(pids)))

    thread = threading.Thread(target=sample, name="peak-rss", daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join(timeout=5)


@dataclass
class Launch:
    """A tool's processes (each in its own session), how to find the node to kill, its log files."""

    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    victims: Callable[[], list[int]] = list  # pids whose process groups are one node
    whole_groups: bool = True  # kill the victims' process groups (a node), not the pids alone
    strays: Callable[[], list[int]] = list  # the tool's processes outside our tree, ended last

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.processes)

    def stop(self, timeout_s: float = 30.0, strays_grace_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for p in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.processes:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        # Detached helpers end on their own once their rank is gone; a few seconds' grace, then SIGKILL.
        grace = time.monotonic() + strays_grace_s
        while (left := self.strays()) and time.monotonic() < grace:
            time.sleep(0.2)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _popen(argv: list[str], env: dict[str, str], log: pathlib.Path, cwd: pathlib.Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        # Niced like ftsup's trainers (ClusterSpec.trainer_nice): every tool shares the cores alike.
        process = subprocess.Popen(["nice", "-n", "10", *argv], stdout=out, stderr=subprocess.STDOUT, env=env,
                                   cwd=cwd, start_new_session=True)
    orphan_guard.watch(process)
    return process


def _free_port() -> int:
    from ftsup.harness.cluster import free_port

    return free_port()


REPO = pathlib.Path(__file__).resolve().parents[1]
TRAINER = pathlib.Path(__file__).with_name("_peer_trainer.py")


def _env(run_dir: pathlib.Path, **extra: str) -> dict[str, str]:
    (run_dir / "tmp").mkdir(parents=True, exist_ok=True)
    return {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(run_dir / "tmp"), "PYTHONUNBUFFERED": "1",
            "GRPC_VERBOSITY": "ERROR", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **extra}


def _trainer_args(args: argparse.Namespace, flavour: str, run_dir: pathlib.Path) -> list[str]:
    return [str(TRAINER), "--flavour", flavour, "--steps", str(args.steps),
            "--checkpoint-every", str(args.checkpoint_every), "--dir", str(run_dir)]


def _rank_pids(run_dir: pathlib.Path, ranks: list[int]) -> list[int]:
    pids = []
    for rank in ranks:
        with contextlib.suppress(FileNotFoundError, ValueError):
            pids.append(int((run_dir / "pids" / f"rank-{rank}").read_text()))
    return pids


def launch_tool(tool: str, args: argparse.Namespace, run_dir: pathlib.Path) -> Launch:
    """Starts one run of a launcher-driven tool (everything but Level 2 ftsup)."""
    world, rpn = 4, 2
    node2 = list(range(rpn, world))
    ours, peers = sys.executable, str(args.peers_python)
    log = run_dir / "launcher.log"
    if tool in ("plain", "torchrun", "nvrx", "dlrover"):
        python = ours if tool in ("plain", "torchrun") else peers
        flavour = {"plain": "plain", "torchrun": "disk", "nvrx": "nvrx", "dlrover": "dlrover"}[tool]
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "peers"]
        if tool == "plain":
            argv = [python, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
                    "--max-restarts", "0", *rdzv]
        elif tool == "torchrun":
            argv = [python, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
                    "--max-restarts", "3", *rdzv]
        elif tool == "nvrx":
            argv = [str(pathlib.Path(peers).parent / "ft_launcher"), "--nnodes", "1", "--nproc-per-node", str(world),
                    "--max-restarts", "3", *rdzv]
        else:
            argv = [str(pathlib.Path(peers).parent / "dlrover-run"), "--standalone", "--nproc_per_node", str(world),
                    "--max_restarts", "3"]
        process = _popen([*argv, *_trainer_args(args, flavour, run_dir)], _env(run_dir), log, REPO)
        return Launch([process], lambda: _rank_pids(run_dir, node2))
    if tool == "torchft":
        port = _free_port()
        lighthouse = _popen([str(pathlib.Path(peers).parent / "torchft_lighthouse"), "--min_replicas", "1",
                             "--quorum_tick_ms", "100", "--join_timeout_ms", "10000", "--bind", f"127.0.0.1:{port}"],
                            _env(run_dir), run_dir / "lighthouse.log", REPO)
        processes = [lighthouse]
        for group in range(world):  # one replica group per DDP rank: torchft's DDP syncs across groups only
            env = _env(run_dir, REPLICA_GROUP_ID=str(group), NUM_REPLICA_GROUPS=str(world),
                       TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}")
            # torchft's Manager joins the store torchrun's agent hosts (MASTER_ADDR/PORT) as a client.
            env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
            argv = [peers, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
                    "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
                    "--rdzv-id", f"group-{group}", *_trainer_args(args, "torchft", run_dir)]
            processes.append(_popen(argv, env, run_dir / f"group-{group}.log", REPO))
        return Launch(processes, lambda: _rank_pids(run_dir, node2))
    if tool == "nvrx-inprocess":
        return _launch_nvrx_inprocess(args, run_dir, world, rpn)
    if tool == "ftsup-run":
        argv = [ours, "-m", "ftsup.harness.cli", "run", "--nnodes", "2", "--local-nodes", "--spares", "1",
                "--nproc-per-node", str(rpn), "--max-restarts", "3", "--run-dir", str(run_dir / "ftsup"),
                *_trainer_args(args, "disk", run_dir)]
        process = _popen(argv, _env(run_dir), log, REPO)

        def victims() -> list[int]:  # the simulated node holding ranks 2-3: its agent's process group
            info = json.loads((run_dir / "ftsup" / "run.json").read_text())
            active = sorted(n for n, v in info["nodes"].items() if v["role"] != "spare")
            return [info["nodes"][active[-1]]["pgid"]]

        return Launch([process], victims)
    raise ValueError(f"not a launcher-driven tool: {tool}")


NVRX_RESERVE_NODES = 1  # NVRx reserve ranks: one node's worth, as ftsup's one hot spare


def _launch_nvrx_inprocess(args: argparse.Namespace, run_dir: pathlib.Path, world: int, rpn: int) -> Launch:
    """NVRx's in-process restart: one process per rank started directly, as a batch scheduler
    (srun) would, 2 nodes x 2 ranks training and one reserve node of 2 ranks waiting inside the
    wrapper. No launcher: torchrun and ft_launcher (bar its min-healthy policy across several
    agents) stop every worker of a node when one dies, which an in-process restart must not see
    (NVRx's known issues). Each rank is its own session; the node to kill is ranks 2-3."""
    total = world + NVRX_RESERVE_NODES * rpn
    ports = {"MASTER_PORT": _free_port(), "BENCH_WRAPPER_PORT": _free_port(), "BENCH_STORE_PORT": _free_port()}
    processes = []
    for rank in range(total):
        env = _env(run_dir, RANK=str(rank), LOCAL_RANK=str(rank % rpn), WORLD_SIZE=str(total),
                   LOCAL_WORLD_SIZE=str(rpn), GROUP_RANK=str(rank // rpn), MASTER_ADDR="127.0.0.1",
                   TORCH_CPP_LOG_LEVEL="error", **{k: str(v) for k, v in ports.items()})
        argv = [str(args.peers_python), *_trainer_args(args, "nvrx-inprocess", run_dir), "--active-world", str(world),
                "--gloo-timeout-s", str(args.nvrx_gloo_timeout_s)]
        processes.append(_popen(argv, env, run_dir / f"rank-{rank}.log", REPO))
    return Launch(processes, lambda: _rank_pids(run_dir, list(range(rpn, world))),
                  strays=lambda: pids_naming(str(run_dir)))


def kill_node(launch: Launch) -> float:
    pids = launch.victims()
    if not pids:
        raise RuntimeError("no pid of the node to kill was written")
    killed_at = time.time()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)  # a launcher starts each worker in its own session
            else:
                os.kill(pid, signal.SIGKILL)
    return killed_at


def one_run(tool: str, args: argparse.Namespace, run_dir: pathlib.Path, kill: bool) -> dict[str, Any]:
    """One run of a tool: to --steps, with one node kill at --kill-at or none."""
    run_dir.mkdir(parents=True)
    if tool == "ftsup":
        return _one_ftsup_run(args, run_dir, kill)
    with peak_rss(also=str(run_dir) if tool == "nvrx-inprocess" else None) as peak:
        launch = launch_tool(tool, args, run_dir)
        progress = Progress(progress_files(run_dir))
        try:
            killed_at = _drive(progress, args, kill, lambda: kill_node(launch), launch.alive, run_dir)
        except BaseException:  # failed or stopped: no run is left to finish by itself
            launch.stop(timeout_s=0.0)
            raise
        launch.stop()
    return _figures(tool, progress.records, args, killed_at, peak[0])


def _drive(progress: Progress, args: argparse.Namespace, kill: bool, do_kill: Callable[[], float],
           alive: Callable[[], bool], run_dir: pathlib.Path) -> float | None:
    deadline = time.monotonic() + args.timeout_s
    killed_at: float | None = None
    while progress.latest_step() < args.steps or (kill and killed_at is None):
        if time.monotonic() > deadline:
            raise RuntimeError(f"run timed out at step {progress.latest_step()} of {args.steps}; see {run_dir}")
        if not alive():
            progress.poll()
            if progress.latest_step() >= args.steps and (killed_at is not None or not kill):
                break
            raise RuntimeError(f"the tool exited at step {progress.latest_step()} of {args.steps}; see {run_dir}")
        progress.poll()
        if kill and killed_at is None and progress.latest_step() >= args.kill_at:
            killed_at = do_kill()
            _say(f"  killed a node at step {progress.latest_step()}")
        time.sleep(POLL_S)
    progress.poll()
    return killed_at


def _figures(tool: str, records: list[StepRecord], args: argparse.Namespace, killed_at: float | None,
             peak: int) -> dict[str, Any]:
    full = 4
    out: dict[str, Any] = {"span_s": run_span_s(records, args.steps), "peak_rss_mib": round(peak / 2**20, 1)}
    if killed_at is None:
        out["step_s"] = steady_step_s(records, args.warmup_steps, full if tool == "torchft" else None)
    else:
        out.update(measure_kill(records, killed_at, full if tool == "torchft" else None, continuous=tool == "torchft"))
        # The steps before the kill are failure-free too: one more steady-state sample per run.
        out["step_s"] = steady_step_s([r for r in records if r.t <= killed_at], args.warmup_steps,
                                      full if tool == "torchft" else None)
    return out


def _one_ftsup_run(args: argparse.Namespace, run_dir: pathlib.Path, kill: bool) -> dict[str, Any]:
    """Level 2: the example trainer (RAM snapshots at --ftsup-snapshot-every, buddy copies) under a LocalCluster of
    2 nodes x 2 ranks and one hot spare with pre-warmed trainers, as bench/recovery.py runs it."""
    from ftsup.harness.cluster import ClusterSpec, LocalCluster
    from ftsup.harness.demo import trainer_argv

    argv = (*trainer_argv(sys.executable, args.steps, 0), "--snapshot-every", args.ftsup_snapshot_every,
            "--grad-sync", args.ftsup_grad_sync)
    spec = ClusterSpec(nodes=2, spares=1, ranks_per_node=2, job_name="peers-bench", trainer_argv=argv, warm_trainers=2)

    def files() -> dict[int, pathlib.Path]:
        return {int(p.name.split(".gen-")[1].split(".")[0]): p for p in (run_dir / "nodes").glob("*/rank-0.gen-*.log")}

    progress = Progress(files)
    with peak_rss() as peak, LocalCluster(spec, run_dir) as cluster:
        cluster.start()

        def do_kill() -> float:
            holders = [n.node_id for n in cluster.nodes() if n.ranks and min(n.ranks) == 2]
            return cluster.kill_node(holders[0])

        killed_at = _drive(progress, args, kill, do_kill, lambda: True, run_dir)
    return _figures("ftsup", progress.records, args, killed_at, peak[0])


def check_peers(args: argparse.Namespace) -> dict[str, str]:
    """Peer versions from the peers' venv; raises SystemExit with the install command when missing."""
    wanted = [t for t in args.tools if t in NEEDS_PEERS_VENV]
    if not wanted:
        return {}
    if not args.peers_python.exists():
        raise SystemExit(f"ftsup bench peers: no peers venv at {args.peers_python} (--peers-python). "
                         f"Make one beside ours, from the repository root:\n  {INSTALL_HINT}")
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            f"for tool, dist in {json.dumps({t: PEER_PACKAGES[t] for t in wanted})}.items():\n"
            "    try: out[tool] = m.version(dist)\n"
            "    except m.PackageNotFoundError: out[tool] = None\n"
            "out['torch'] = m.version('torch')\n"
            "print(json.dumps(out))\n")
    found = json.loads(subprocess.run([str(args.peers_python), "-c", code], check=True, capture_output=True,
                                      text=True, timeout=120).stdout)
    missing = [PEER_PACKAGES[t] for t in wanted if not found.get(t)]
    if missing:
        raise SystemExit(f"ftsup bench peers: {', '.join(missing)} not installed in {args.peers_python}; "
                         f"from the repository root:\n  {INSTALL_HINT}")
    return found


def _versions() -> dict[str, str]:
    import importlib.metadata as m

    try:
        ours = m.version("ftsup")
    except m.PackageNotFoundError:  # run from a checkout on PYTHONPATH (a GPU host's link farm)
        ours = "not installed (a checkout on PYTHONPATH)"
    return {"torch": m.version("torch"), "ftsup": ours}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    versions = {**_versions(), **{f"peers_{k}": v for k, v in check_peers(args).items()}}

    workdir = arguments.run_directory("ftsup-bench-peers-", args.dir)
    load_before = os.getloadavg()
    errors: dict[str, str] = {}
    cleans: dict[str, list[dict[str, Any]]] = {}
    kills: dict[str, list[dict[str, Any]]] = {}
    for run in plan_runs(args.tools, args.repeats):
        if run.tool in errors or (run.kill and run.tool not in cleans):
            continue  # failed before: its later rounds are skipped, the others go on
        what = f"run {run.index} of {args.repeats} with a node kill at step {args.kill_at}" if run.kill else (
            f"failure-free run {run.index}")
        _say(f"round {run.round}, {run.tool}: {what}")
        try:
            result = one_run(run.tool, args, workdir / run.tool / run.name, kill=run.kill)
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
            if run.tool == "plain" and run.index > 1:  # one baseline run lost: the other rounds' stand
                errors[f"plain-round-{run.round}"] = str(exc)
                _say(f"plain: FAILED in round {run.round}: {exc}")
                continue
            errors[run.tool] = str(exc)
            _say(f"{run.tool}: FAILED: {exc}")
            continue
        result["round"] = run.round  # to pair a run with plain DDP's of the same round
        if not run.kill:
            cleans.setdefault(run.tool, []).append(result)
            continue
        clean_span = cleans[run.tool][0].get("span_s")
        if result.get("span_s") is not None and clean_span is not None:
            result["goodput_lost_s"] = round(result["span_s"] - clean_span, 3)
        kills.setdefault(run.tool, []).append(result)
        _say(f"  {run.tool}: {result}")
    plain_step = baseline_step_s(cleans.get("plain", []))
    results: dict[str, dict[str, Any]] = {}
    for tool, runs in cleans.items():
        if tool in errors:
            continue
        if tool == "plain":
            results[tool] = aggregate(tool, runs[0], [], None, more_clean=runs[1:])
            results[tool]["figures"]["baseline_step_s"] = plain_step
        else:
            results[tool] = aggregate(tool, runs[0], kills.get(tool, []), plain_step)
    rat = ratios(results)
    report = {
        "world": {"nodes": 2, "ranks_per_node": 2, "backend": "gloo", "model": "trainer/examples/gpt.py defaults"},
        "steps": args.steps, "kill_at": args.kill_at, "repeats": args.repeats,
        "checkpoint_every": args.checkpoint_every, "ftsup_snapshot_every": args.ftsup_snapshot_every,
        "ftsup_grad_sync": args.ftsup_grad_sync,
        "nvrx_gloo_timeout_s": args.nvrx_gloo_timeout_s,
        "versions": versions,
        "load_avg": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "cpus": os.cpu_count(),
        "tools": results, "errors": errors, "ftsup_vs_best_peer": rat, "goals": goals(results, rat),
    }
    if not args.keep and not errors:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        report["workdir"] = str(workdir)
    print(json.dumps(report))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
