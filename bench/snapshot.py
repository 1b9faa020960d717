"""Snapshot pause: the training step's pause per in-memory snapshot versus torch.save to a file.

A real local cluster (supervisor + 2 agents, 1 rank each, each rank's buddy on the other node)
runs bench/_snapshot_rank.py: rank 0 holds a ~500 MB model + AdamW state, rank 1 a small one (it
only has to hand off its own snapshots for a step to commit; two 500 MB ranks and their copies do
not fit this machine's RAM next to other work). Rank 0 is snapshotted through the real `Session`
path (copy into reused host buffers, encode, stream it in ~4 MiB chunks to the local agent, which
forwards each chunk to the buddy agent as it lands and answers once the buddy holds its copy). The pause is what the training thread loses per
snapshot: the `snapshot()` call plus any wait of the next `optimizer.step()` for the background
copy. Measured for both copy modes (on the training thread: the old path; in the background).
Background figures: until the rank's agent acknowledged (local + buddy hold it) and until the
supervisor logged SnapshotCommitted. Baselines in the same run, on the same state: torch.save to
a local file (with and without fsync), and the peers' answers to the same problem, each in its own
process (bench/_snapshot_peers.py, with the peers' venv's python when there is one):
`torch.distributed.checkpoint.async_save` to local disk (default staging, and async staging with a
reused stager), DLRover's Flash Checkpoint to memory and NVRx local checkpointing. Per peer: the
training pause, the time until the copy is stored where the peer keeps it, the time until a copy
survives the loss of the node (null with the reason when it never does) and the memory it took. A
peer that cannot run here says why in the JSON. `--device cuda` puts every rank's state and the
baselines' on the GPU (device 0; the copy is then a device-to-host copy into pinned buffers on a side
stream, and DCP's async staging may use pinned memory). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from ftsup.harness.cluster import ClusterError, ClusterSpec, LocalCluster
from ftsup.v1 import operator_pb2

GOAL_PAUSE_RATIO = 0.05
HEARTBEAT_MISSES = 30
TRAINER_NICE = 10  # the local cluster's default; the torch.save baseline runs at the same niceness

# The peers' baselines (bench/_snapshot_peers.py runs them): name -> how it is configured.
PEER_BASELINES = {
    "dcp_async_save": (
        "torch.distributed.checkpoint.async_save(state, storage_writer=FileSystemWriter(dir), no_dist=True) "
        "at its defaults: staging copies the state on the calling thread, a thread writes the files and fsyncs them"),
    "dcp_async_save_async_staging": (
        "the same with a reused DefaultStager(StagingOptions(use_async_staging=True)), pinned memory and "
        "non-blocking copies on a GPU (on CPU neither applies): the copy runs in the background, the next "
        "optimizer.step() waits for it"),
    "dlrover_flash_memory": (
        "DLRover Flash Checkpoint: DdpCheckpointer(dir).save_checkpoint(step, state, StorageType.MEMORY) "
        "in a plain process (its engine starts its own saver process outside dlrover-run); copies into "
        "this host's shared memory on the training thread; replica_count 0"),
    "nvrx_local": (
        "NVRx local checkpointing: LocalCheckpointManager(dir).save(BasicTensorAwareStateDict(state), step, "
        "is_async=True) in a one-rank gloo group (on a GPU; AdamW's CPU step counters moved to the GPU, "
        "its state dict takes CUDA tensors only)"),
}
# Why each peer's copy is lost with the node (none of them sends one off the node as measured here).
PEER_NODE_LOSS = {
    "dcp_async_save": "local disk only: FileSystemWriter writes this node's disk (a remote copy needs a remote writer, e.g. ftsup bench checkpoint's S3 figures)",
    "dcp_async_save_async_staging": "local disk only, as dcp_async_save",
    "dlrover_flash_memory": (
        "this host's shared memory only. For DDP (DdpCheckpointer) DLRover's replica manager does no backup "
        "(FullCkptReplicaManager.backup is a no-op: every node's rank 0 holds the same replicated state); a "
        "per-rank state as ftsup's here needs its sharded engines' ShardCkptReplicaManager (replica_count >= 2, "
        "an all_gather of each rank's shared memory across nodes on the training thread), not measured"),
    "nvrx_local": "local disk only without its replication strategy (which needs CUDA as the rest of it)",
}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_cluster(
    workdir: pathlib.Path, state_mb: float, peer_state_mb: float, snapshots: int, timeout_s: float,
    device: str = "cpu",
) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """Runs the snapshot job; returns each rank's report and step -> SnapshotCommitted wall time."""
    out = workdir / "ranks"
    spec = ClusterSpec(
        nodes=2, spares=0, ranks_per_node=1, job_name="snapshot-bench", trainer_nice=TRAINER_NICE,
        # Death only after 30 missed 1 s heartbeats, not 2: kept from when an agent's event loop
        # stalled for seconds parsing and forwarding one 500 MB message (chunks no longer do), so
        # runs stay comparable; a death verdict would end the run being measured. This bench
        # measures the pause and the hand-off, not detection.
        heartbeat_misses=HEARTBEAT_MISSES,
        trainer_argv=(sys.executable, "-m", "ftsup.bench._snapshot_rank", "--state-mb", str(state_mb),
                      "--peer-state-mb", str(peer_state_mb), "--snapshots", str(snapshots), "--out", str(out),
                      "--device", device),
    )
    with LocalCluster(spec, workdir / "cluster") as cluster:
        cluster.start()
        _say(f"cluster up ({cluster.address}); rank 0 {state_mb:g} MB, rank 1 {peer_state_mb:g} MB, "
             f"{snapshots} snapshots per mode")
        def completed() -> bool:
            for node in cluster.agents.values():
                if node.process.poll() is not None:  # e.g. a refused --workdir: fail now, not at the timeout
                    raise ClusterError(f"agent {node.node_id} exited with {node.process.returncode}; see {node.log_path}")
            return cluster.status().phase == operator_pb2.JOB_PHASE_COMPLETED

        cluster.wait_for(completed, timeout_s, "the snapshot job to complete", poll_s=0.5)
        committed: dict[int, float] = {}  # step -> when its first SnapshotCommitted was appended
        for record in cluster.events():
            if record.event.WhichOneof("kind") == "snapshot_committed":
                committed.setdefault(record.event.snapshot_committed.step, record.time_unix_s)
    reports = [json.loads(path.read_text()) for path in sorted(out.glob("rank-*.json"))]
    if len(reports) != 2:
        raise ClusterError(f"expected 2 rank reports in {out}, found {len(reports)}")
    return reports, committed


def time_torch_save(directory: pathlib.Path, state_mb: float, repeats: int,
                    device: str = "cpu") -> dict[str, list[float]]:
    """torch.save of the bench state (same builder, same snapshot format) to a local file."""
    import torch

    from ftsup.bench._snapshot_rank import build_state_model
    from ftsup.trainer import snapshot as snap

    os.nice(max(0, TRAINER_NICE - os.nice(0)))  # as niced as the trainers were (the cluster is stopped by now)
    model, optimizer, _width = build_state_model(state_mb, device=device)
    state = snap.build_state(1, model, optimizer)
    path = directory / "baseline.pt"
    samples: dict[str, list[float]] = {"plain": [], "fsync": []}
    for kind in ("plain", "fsync"):
        for _ in range(repeats):
            path.unlink(missing_ok=True)
            started = time.monotonic()
            with open(path, "wb") as f:
                torch.save(state, f)
                if kind == "fsync":
                    f.flush()
                    os.fsync(f.fileno())
            samples[kind].append(time.monotonic() - started)
    path.unlink(missing_ok=True)
    return samples


def default_peers_python() -> pathlib.Path:
    """The peers' venv beside ours (docs/peers.md: `cp -a .venv .venv-peers`, then the extra)."""
    return pathlib.Path(sys.prefix).parent / ".venv-peers" / "bin" / "python"


def run_peer_baselines(python: str, directory: pathlib.Path, state_mb: float, saves: int,
                       timeout_s: float, device: str = "cpu") -> dict[str, dict[str, Any]]:
    """Each peer baseline in its own process; one that fails is recorded with its error, not dropped."""
    results: dict[str, dict[str, Any]] = {}
    for name in PEER_BASELINES:
        log_path = directory / f"peer-{name}.log"
        argv = [python, "-m", "ftsup.bench._snapshot_peers", "--baseline", name, "--state-mb", str(state_mb),
                "--saves", str(saves), "--dir", str(directory / f"peer-{name}"), "--device", device]
        _say(f"timing {name} ({python})")
        with open(log_path, "wb") as log:
            try:
                done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                results[name] = {"ran": False, "reason": f"timed out after {timeout_s:g} s"}
                continue
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        try:  # a peer that failed prints its error as JSON too, and exits 1
            results[name] = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            results[name] = {}
        if not results[name]:
            results[name] = {"ran": False, "reason": f"exited with {done.returncode} without a result"}
        if not results[name].get("ran") and done.returncode != 0:  # its log, for the one who reads the JSON
            results[name]["log_tail"] = log_path.read_text(errors="replace").strip().splitlines()[-20:]
    return results


def summarize_peer(name: str, measured: dict[str, Any]) -> dict[str, Any]:
    """One peer's figures, in the shape of ftsup's entry (bench/_snapshot_peers.py measured them)."""
    entry: dict[str, Any] = {"config": PEER_BASELINES[name], "ran": measured.get("ran", False)}
    if not entry["ran"]:
        entry["reason"] = measured.get("reason", "no result")
        if "log_tail" in measured:  # its traceback: the reason alone is one line
            entry["log_tail"] = measured["log_tail"]
        return entry
    samples = measured["samples"]
    pauses = [s["call_s"] + s["optimizer_wait_s"] for s in samples]
    entry.update({
        "pause_s": round(statistics.median(pauses), 4),
        "pause_samples_s": [round(x, 4) for x in pauses],
        "optimizer_wait_s": round(statistics.median(s["optimizer_wait_s"] for s in samples), 4),
        "stored_s": round(statistics.median(s["stored_s"] for s in samples), 4),
        "survives_node_loss_s": None,
        "survives_node_loss_why_not": PEER_NODE_LOSS[name],
        "memory_bytes": measured["rss_peak_bytes"] - measured["rss_before_bytes"],
        "state_bytes": measured["state_bytes"],
    })
    return entry


def compare(ftsup: dict[str, Any], peers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """ftsup against the best peer that ran, per figure (ratio < 1: ftsup is better)."""
    ran = {name: peer for name, peer in peers.items() if peer["ran"]}
    result: dict[str, Any] = {}
    if ran:
        best = min(ran, key=lambda name: ran[name]["pause_s"])
        result["pause"] = {"best_peer": best, "peer_s": ran[best]["pause_s"], "ftsup_s": ftsup["pause_s"],
                           "ratio": round(ftsup["pause_s"] / ran[best]["pause_s"], 3) if ran[best]["pause_s"] else None}
        lightest = min(ran, key=lambda name: ran[name]["memory_bytes"])
        result["memory"] = {"lightest_peer": lightest, "peer_bytes": ran[lightest]["memory_bytes"],
                            "ftsup_bytes": ftsup["memory_bytes"]}
    remote = {name: peer for name, peer in ran.items() if peer["survives_node_loss_s"] is not None}
    if remote:
        best = min(remote, key=lambda name: remote[name]["survives_node_loss_s"])
        result["survives_node_loss"] = {"best_peer": best, "peer_s": remote[best]["survives_node_loss_s"],
                                        "ftsup_s": ftsup["survives_node_loss_s"]}
    else:
        result["survives_node_loss"] = {"best_peer": None, "ftsup_s": ftsup["survives_node_loss_s"],
                                        "note": "no peer measured here keeps a copy off the node"}
    return result


def summarize(reports: list[dict[str, Any]], committed: dict[int, float], saves: dict[str, list[float]],
              peer_results: dict[str, dict[str, Any]] | None = None, device: str = "cpu") -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 4)

    by_mode: dict[str, list[dict[str, Any]]] = {"sync": [], "background": []}
    main_rank = next(r for r in reports if r["rank"] == 0)  # the one holding the measured state
    for sample in main_rank["samples"]:
        by_mode[sample["mode"]].append(sample)
    pauses = {m: [s["snapshot_call_s"] + s["optimizer_wait_s"] for s in ss] for m, ss in by_mode.items()}
    called: dict[int, float] = {}  # step -> the last rank's snapshot() call
    for report in reports:
        for sample in report["samples"]:
            if sample["mode"] == "background":
                called[sample["step"]] = max(called.get(sample["step"], 0.0), sample["called_at_unix_s"])
    commit_s = [committed[step] - at for step, at in called.items() if step in committed]
    torch_save_s = med(saves["plain"])
    pause_s = med(pauses["background"])
    result: dict[str, Any] = {
        "device": main_rank.get("device", device),
        "state_bytes": main_rank["state_bytes"],
        "payload_bytes": main_rank["payload_bytes"],
        "peer_state_bytes": [r["state_bytes"] for r in reports if r["rank"] != 0],
        "pause_s": pause_s,
        "torch_save_s": torch_save_s,
        "torch_save_fsync_s": med(saves["fsync"]),
        "pause_ratio": round(pause_s / torch_save_s, 4),
        "pause_ratio_fsync": round(pause_s / med(saves["fsync"]), 4),
        "pause_samples_s": [round(x, 4) for x in pauses["background"]],
        "background_copy_s": med([s["copy_s"] for s in by_mode["background"]]),
        "optimizer_wait_s": med([s["optimizer_wait_s"] for s in by_mode["background"]]),
        "held_s": med([s["held_s"] for s in by_mode["background"]]),
        "committed_s": med(commit_s) if commit_s else None,
        "next_step_s": med([s["next_step_s"] for s in by_mode["background"]]),
        "sync_copy": {
            "name": "copy on the training thread (Session(background_capture=False), the path before this change)",
            "pause_s": med(pauses["sync"]),
            "pause_ratio": round(med(pauses["sync"]) / torch_save_s, 4),
            "pause_samples_s": [round(x, 4) for x in pauses["sync"]],
        },
        "baseline": {
            "name": "torch.save of the same state to a local file",
            "torch_save_samples_s": [round(x, 4) for x in saves["plain"]],
            "torch_save_fsync_samples_s": [round(x, 4) for x in saves["fsync"]],
        },
        "what": (
            "pause = Session.snapshot() call + the next optimizer.step()'s wait for the background copy; "
            "held_s = snapshot() call -> the PutSnapshot stream acknowledged (held by the rank's agent and its buddy agent); "
            "committed_s = last rank's snapshot() call -> the supervisor's SnapshotCommitted record; "
            f"rank 0's figures; 2 ranks on 2 agents on one machine, state on {device}, heartbeat 1 s x {HEARTBEAT_MISSES} misses; trainers and torch.save at nice {TRAINER_NICE}"
        ),
        "goal": {"pause_ratio": GOAL_PAUSE_RATIO},
    }
    result["goal_met"] = result["pause_ratio"] <= GOAL_PAUSE_RATIO
    if peer_results is not None:
        ftsup = {
            "pause_s": pause_s,
            "survives_node_loss_s": result["held_s"],
            # the rank's reused host buffers + the copy its agent holds + the copy its buddy holds
            "memory_bytes": main_rank["host_buffer_bytes"] + 2 * main_rank["payload_bytes"],
        }
        peers = {name: summarize_peer(name, measured) for name, measured in peer_results.items()}
        result["peers"] = {"ftsup": ftsup, **peers}
        result["ftsup_vs_best_peer"] = compare(ftsup, peers)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench snapshot", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--state-mb", type=float, default=500.0, help="model + AdamW state per rank (default 500)")
    parser.add_argument("--peer-state-mb", type=float, default=20.0, help="rank 1's state (default 20)")
    parser.add_argument("--snapshots", type=int, default=5, help="snapshots per copy mode and rank (default 5)")
    parser.add_argument("--saves", type=int, default=3, help="torch.save repetitions per baseline (default 3)")
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="work directory on local disk (default: a temp dir)")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--peers-python", type=pathlib.Path, default=None,
                        help="python of the venv with the bench-peers extra (default: .venv-peers/bin/python beside "
                             "ours if it exists, else this python: the peers it lacks are reported as not installed)")
    parser.add_argument("--no-peers", action="store_true", help="skip the peers' baselines")
    parser.add_argument("--quick", action="store_true", help="a 20 MB state, 2 snapshots, 1 save: for tests")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where every rank's and baseline's state lives (default cpu; cuda: device 0)")
    args = parser.parse_args(argv)
    if args.quick:
        args.state_mb, args.peer_state_mb, args.snapshots, args.saves = 20.0, 5.0, 2, 1
    if args.state_mb <= 0 or args.snapshots < 1 or args.saves < 1:
        parser.error(f"--state-mb must be > 0, got {args.state_mb}; "
                     f"--snapshots and --saves >= 1, got {args.snapshots}, {args.saves}")
    peers_python = args.peers_python
    if peers_python is None:
        peers_python = default_peers_python() if default_peers_python().exists() else pathlib.Path(sys.executable)
    elif not peers_python.exists():
        parser.error(f"--peers-python {peers_python} does not exist (docs/peers.md says how to make the peers' venv)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error(f"--device cuda: torch {torch.__version__} sees no CUDA device here")
    with tempfile.TemporaryDirectory(prefix="ftsup-bench-snapshot-", dir=args.dir) as tmp:
        workdir = pathlib.Path(tmp)
        try:
            reports, committed = run_cluster(workdir, args.state_mb, args.peer_state_mb, args.snapshots, args.timeout_s,
                                             args.device)
        except ClusterError as exc:
            _say(f"ftsup bench snapshot: {exc}")
            return 1
        _say("cluster stopped; timing torch.save of the same state")
        saves = time_torch_save(workdir, args.state_mb, args.saves, args.device)
        peer_results = None
        if not args.no_peers:
            peer_results = run_peer_baselines(str(peers_python), workdir, args.state_mb, args.snapshots,
                                             args.timeout_s, args.device)
    print(json.dumps(summarize(reports, committed, saves, peer_results, args.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
