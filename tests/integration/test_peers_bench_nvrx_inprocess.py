"""`ftsup bench peers --tools nvrx-inprocess`, for real, when the peers' venv is there (docs/peers.md:
`.venv-peers` with the bench-peers extra; the test skips without it). One kill of a node's ranks:
NVRx's in-process wrapper must bring the survivors and the reserve node back to the full world in
the same processes (a second restart iteration's progress log, at world 4), and nothing the run
started may be left running."""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import subprocess

import pytest

from ftsup.bench import peers

pytestmark = pytest.mark.integration

PEERS_PYTHON = pathlib.Path(peers.REPO) / ".venv-peers" / "bin" / "python"


def _nvrx_installed() -> bool:
    if not PEERS_PYTHON.exists():
        return False
    probe = subprocess.run([str(PEERS_PYTHON), "-c", "import nvidia_resiliency_ext.inprocess"], capture_output=True,
                           timeout=120)
    return probe.returncode == 0


@pytest.mark.skipif(not _nvrx_installed(), reason="no .venv-peers with nvidia-resiliency-ext (docs/peers.md)")
def test_nvrx_in_process_restart_recovers_the_full_world_in_the_same_processes(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    argv = ["--tools", "nvrx-inprocess", "--repeats", "1", "--steps", "24", "--kill-at", "13",
            "--checkpoint-every", "5", "--timeout-s", "240", "--keep", "--dir", str(tmp_path),
            "--peers-python", str(PEERS_PYTHON)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert peers.main(argv) == 0
    report = json.loads(printed.getvalue())
    assert report["errors"] == {} and report["versions"]["peers_nvrx-inprocess"]
    (kill,) = report["tools"]["nvrx-inprocess"]["kills"]
    assert kill["recovery_s"] is not None and kill["regain_s"] is not None, kill
    # Resumed from the disk checkpoint (every 5 steps) before the kill: steps 11 or 16 on.
    assert kill["first_step"] in (11, 16) and 0 <= kill["lost_steps"] <= 5, kill
    run_dir = pathlib.Path(report["workdir"]) / "nvrx-inprocess" / "kill-1"
    restarted = (run_dir / "progress-1.log").read_text().splitlines()
    assert restarted and all(" world 4 " in line for line in restarted), restarted[:3]
    assert sorted(p.name for p in (run_dir / "pids").iterdir()) == [f"rank-{r}" for r in range(6)]
    assert peers.pids_naming(str(run_dir)) == []
