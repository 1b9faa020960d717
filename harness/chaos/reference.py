"""The uninterrupted run's final parameter digest, computed once per (steps, seed, world) per run.

The example trainer launched torchrun-style with `--offline` trains the same bits as under the
supervisor (trainer/offline.py), so the reference needs no cluster: `world` gloo processes on
loopback. Fault flags are never passed: the reference is the job as it was meant to run.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from ftsup.harness import orphan_guard
from ftsup.harness.cluster import ClusterError, free_port

EXAMPLE_TRAINER = "ftsup.trainer.examples.gpt"


@dataclass(frozen=True, slots=True)
class ReferenceKey:
    steps: int
    seed: int
    world: int


def trainer_base_argv(python: str, steps: int, seed: int) -> tuple[str, ...]:
    return (python, "-m", EXAMPLE_TRAINER, "--steps", str(steps), "--seed", str(seed))


def offline_digest(key: ReferenceKey, workdir: pathlib.Path, timeout_s: float = 300.0) -> str:
    """Trains the job without ftsup on `key.world` local gloo ranks; returns rank 0's final digest."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(key.world):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(key.world), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
            with open(workdir / f"offline-rank-{rank}.log", "wb") as log:
                procs.append(subprocess.Popen([*trainer_base_argv(sys.executable, key.steps, key.seed), "--offline"],
                                              env=env, stdout=subprocess.PIPE, stderr=log, start_new_session=True))
                orphan_guard.watch(procs[-1])
        outputs = [p.communicate(timeout=timeout_s)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    match = re.search(r"final digest ([0-9a-f]+)", outputs[0]) if outputs else None
    # Completion is what rank 0 printed, not exit codes: a gloo rank sometimes aborts in teardown
    # after training finished ("terminate called without an active exception", SIGABRT).
    if match is None:
        raise ClusterError(f"the offline reference run failed (exit codes {codes}); logs in {workdir}")
    return match.group(1)


@dataclass
class References:
    """Digests computed on first use and reused by every scenario of the same shape in this run."""

    workdir: pathlib.Path
    _digests: dict[ReferenceKey, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def digest(self, key: ReferenceKey) -> str:
        with self._lock:
            if key not in self._digests:
                where = self.workdir / f"reference-w{key.world}-s{key.steps}-seed{key.seed}"
                self._digests[key] = offline_digest(key, where)
            return self._digests[key]
