"""Failure detection on real processes: SIGKILL of an agent, and SIGSTOP (a silent node).

Seconds from the signal to the supervisor's NodeDeclaredDead record, at the default 1 s
heartbeat. Baseline in the same run: the same supervisor with the stream-close signal ignored
(heartbeats only, 3 misses: a 600 s reconnect grace and no agent probe, whose refused connect
would otherwise end a killed node 0.15 s after its close), which is how keep-alive based detectors such as TorchElastic's
rendezvous work. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

from ftsup.harness.cluster import ClusterSpec, LocalCluster

IDLE_TRAINER = (sys.executable, "-c", "import time; time.sleep(3600)")


def death_time(cluster: LocalCluster, node_id: str, deadline_s: float) -> float:
    def find() -> float | None:
        for record in cluster.events():
            event = record.event
            if event.WhichOneof("kind") == "node_declared_dead" and event.node_declared_dead.node_id == node_id:
                return record.time_unix_s
        return None

    return cluster.wait_for(find, deadline_s, f"the death verdict on {node_id}", poll_s=0.05)


def registered(cluster: LocalCluster, node_id: str) -> bool:
    return any(n.node_id == node_id and n.connected for n in cluster.nodes())


def trial(cluster: LocalCluster, node_id: str, how: str, rng: random.Random) -> float:
    node = cluster.start_agent(node_id, "spare")
    cluster.wait_for(lambda: registered(cluster, node_id), 60, f"{node_id} to register")
    time.sleep(rng.uniform(0.0, 1.0))  # a random phase against the heartbeat clock, not a wait
    sent_at = time.time()
    os.killpg(node.process.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    detected = death_time(cluster, node_id, 30) - sent_at
    if how == "stop":
        os.killpg(node.process.pid, signal.SIGKILL)
    node.process.wait(timeout=10)
    return detected


def run_series(workdir: pathlib.Path, spec: ClusterSpec, kinds: dict[str, int], seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    with LocalCluster(spec, workdir) as cluster:
        cluster.start_supervisor_only()
        cluster.start_agent("anchor", "active")  # holds the job's one rank; the trial nodes are spares
        for kind, count in kinds.items():
            for i in range(count):
                samples[kind].append(round(trial(cluster, f"{kind}-{i}", kind, rng), 3))
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench detection", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one trial of each, for tests")
    args = parser.parse_args(argv)
    trials = 1 if args.quick else args.trials
    defaults = ClusterSpec(nodes=1, spares=0, ranks_per_node=1, trainer_argv=IDLE_TRAINER, job_name="detect")
    baseline = ClusterSpec(nodes=1, spares=0, ranks_per_node=1, trainer_argv=IDLE_TRAINER, job_name="detect",
                           heartbeat_misses=3, reconnect_grace_s=600.0, supervisor_args=("--no-agent-probe",))
    with tempfile.TemporaryDirectory(prefix="ftsup-bench-detect-") as tmp:
        ours = run_series(pathlib.Path(tmp) / "ftsup", defaults, {"kill": trials, "stop": trials}, args.seed)
        theirs = run_series(pathlib.Path(tmp) / "baseline", baseline, {"kill": max(1, trials // 2)}, args.seed)
    result: dict[str, Any] = {
        "heartbeat_interval_s": defaults.heartbeat_interval_s,
        "heartbeat_misses": defaults.heartbeat_misses,
        "reconnect_grace_s": defaults.reconnect_grace_s,
        "kill_detect_s": statistics.median(ours["kill"]),
        "silent_detect_s": statistics.median(ours["stop"]),
        "kill_samples_s": ours["kill"],
        "silent_samples_s": ours["stop"],
        "baseline": {
            "name": "heartbeats only (stream close ignored), 3 misses of 1 s",
            "kill_detect_s": statistics.median(theirs["kill"]),
            "kill_samples_s": theirs["kill"],
        },
        "goal": {"kill_detect_s": 0.5, "silent_detect_s": 2.5},
    }
    result["goal_met"] = result["kill_detect_s"] <= 0.5 and result["silent_detect_s"] <= 2.5
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
