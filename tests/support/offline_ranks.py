"""Runs a training script torchrun-style on local gloo ranks without ftsup (`--offline`): the
uninterrupted reference a recovered run is compared with."""

from __future__ import annotations

import os
import pathlib
import subprocess

from ftsup.harness.cluster import ClusterError, free_port


def run_offline(argv: list[str], world: int, workdir: pathlib.Path, timeout_s: float = 300.0) -> str:
    """Starts `argv + ["--offline"]` as ranks 0..world-1 (one per simulated node); returns rank 0's stdout."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tmp").mkdir(exist_ok=True)
    port = str(free_port())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(world):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
                   "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                   "OMP_NUM_THREADS": "1", "TMPDIR": str(workdir / "tmp")}
            with open(workdir / f"offline-rank-{rank}.log", "wb") as log:
                procs.append(subprocess.Popen([*argv, "--offline"], env=env, stdout=subprocess.PIPE, stderr=log,
                                              start_new_session=True))
        outputs = [p.communicate(timeout=timeout_s)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if "final loss" not in outputs[0]:
        raise ClusterError(f"the offline reference run failed (exit codes {[p.returncode for p in procs]}); logs in {workdir}")
    return outputs[0]
