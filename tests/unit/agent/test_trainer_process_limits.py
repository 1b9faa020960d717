"""Trainers start as the kernel's first OOM victims and without the agent's capabilities.

Real child processes (a few milliseconds each): the OOM score is read back from /proc; the
capability check runs a tiny agent-side script as an unprivileged user holding CAP_SYSLOG as an
ambient capability, as the systemd unit gives it, through util-linux `setpriv`.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from ftsup.agent.process import TRAINER_OOM_SCORE_ADJ, AsyncioProcessRunner

CAP_SYSLOG_BIT = 1 << 34

SCRIPT = r'''
import asyncio, pathlib, sys
from ftsup.agent.process import AsyncioProcessRunner, drop_ambient_capabilities
def effective(text):
    return int(next(l for l in text.splitlines() if l.startswith("CapEff:")).split()[1], 16)
async def main(out, drop):
    if drop:
        assert drop_ambient_capabilities()
    runner = AsyncioProcessRunner()
    await runner.wait(await runner.spawn(["/bin/cat", "/proc/self/status"], {}, pathlib.Path(out)))
    print(effective(pathlib.Path("/proc/self/status").read_text()), effective(pathlib.Path(out).read_text()))
asyncio.run(main(sys.argv[1], sys.argv[2] == "drop"))
'''


async def test_a_trainer_starts_with_a_higher_oom_score_than_the_agent(tmp_path: pathlib.Path) -> None:
    runner = AsyncioProcessRunner()
    handle = await runner.spawn(["/bin/sh", "-c", "cat /proc/self/oom_score_adj"], {}, tmp_path / "out.log")
    assert await runner.wait(handle) == 0
    trainer = int((tmp_path / "out.log").read_text())
    agent = int(pathlib.Path("/proc/self/oom_score_adj").read_text())
    assert trainer == TRAINER_OOM_SCORE_ADJ > agent


@pytest.fixture
def shared_dir() -> Iterator[pathlib.Path]:
    """A directory the unprivileged user can reach and write (pytest's tmp_path is root's alone)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="ftsup-caps-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def can_grant_ambient_caps() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


@pytest.mark.skipif(not can_grant_ambient_caps(), reason="needs root and util-linux setpriv to grant an ambient capability")
@pytest.mark.parametrize("mode", ["keep", "drop"])
def test_trainers_do_not_inherit_the_agents_ambient_cap_syslog(shared_dir: pathlib.Path, mode: str) -> None:
    tmp_path = shared_dir
    (tmp_path / "check.py").write_text(SCRIPT)
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+syslog",
         "--ambient-caps=+syslog", sys.executable, str(tmp_path / "check.py"), str(tmp_path / "out"), mode],
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    agent_caps, trainer_caps = map(int, done.stdout.split())
    assert agent_caps & CAP_SYSLOG_BIT  # the agent keeps what it needs for /dev/kmsg
    # The control run (no drop) shows the leak the agent prevents: without the drop a trainer holds it.
    assert bool(trainer_caps & CAP_SYSLOG_BIT) == (mode == "keep")
