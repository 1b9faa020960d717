"""The systemd units pass `systemd-analyze verify`, and the check would catch a broken unit.

`verify` exits 0 on many problems it only warns about ("Unknown key ..., ignoring"), so any
diagnostic naming the unit counts as a failure. ExecStart is pointed at this venv's `ftsup` so
verify can check that the binary exists.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
UNITS = ("ftsup-supervisor.service", "ftsup-agent.service")
ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)")


def ftsup_binary() -> str:
    path = pathlib.Path(sys.executable).parent / "ftsup"
    if not path.exists():
        pytest.fail(f"{path} is missing: install the project (pip install -e .) so the units can point at it")
    return str(path)


def copied(tmp_path: pathlib.Path, unit: str, edit: tuple[str, str] | None = None) -> pathlib.Path:
    text = (ROOT / "systemd" / unit).read_text().replace("/opt/ftsup/bin/ftsup", ftsup_binary())
    if edit is not None:
        assert edit[0] in text, f"{edit[0]!r} not in {unit}"
        text = text.replace(*edit)
    path = tmp_path / unit
    path.write_text(text)
    return path


def verify(path: pathlib.Path) -> tuple[int, list[str]]:
    assert ANALYZE is not None
    done = subprocess.run([ANALYZE, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (done.stdout + done.stderr).splitlines() if path.name in line]
    return done.returncode, problems


@pytest.mark.parametrize("unit", UNITS)
def test_the_unit_verifies_cleanly(tmp_path: pathlib.Path, unit: str) -> None:
    code, problems = verify(copied(tmp_path, unit))
    assert code == 0 and not problems, problems


@pytest.mark.parametrize(
    "edit",
    [
        ("KillMode=mixed", "KillMode=sometimes"),  # a bad value: verify only warns
        ("Type=notify", "Type=notifyy"),
        ("WatchdogSec=30s", "WatchdogSec=30s\nWatchdogSecs=1"),  # an unknown key
        ("ExecStart=", "ExecStart=/nonexistent/ftsup agent\n#"),  # a missing binary: verify exits non-zero
    ],
)
def test_a_broken_unit_fails_verification(tmp_path: pathlib.Path, edit: tuple[str, str]) -> None:
    code, problems = verify(copied(tmp_path, "ftsup-agent.service", edit))
    assert code != 0 or problems


@pytest.mark.parametrize("unit", UNITS)
def test_the_units_notify_watchdog_restart_and_read_etc_ftsup(unit: str) -> None:
    text = (ROOT / "systemd" / unit).read_text()
    settings = dict(re.findall(r"^(\w+)=(.*)$", text, flags=re.MULTILINE))
    assert settings["Type"] == "notify" and settings["Restart"] == "on-failure"
    assert int(settings["WatchdogSec"].rstrip("s")) > 0
    daemon = unit.removeprefix("ftsup-").removesuffix(".service")
    assert f"--config /etc/ftsup/{daemon}.toml" in settings["ExecStart"]
    assert settings["EnvironmentFile"] == f"-/etc/ftsup/{daemon}.env"


def test_the_agent_unit_keeps_the_node_through_a_trainer_oom_and_stops_retrying_a_refusal() -> None:
    text = (ROOT / "systemd" / "ftsup-agent.service").read_text()
    settings = dict(re.findall(r"^(\w+)=(.*)$", text, flags=re.MULTILINE))
    from ftsup.agent.main import EXIT_REFUSED, EXIT_USAGE
    from ftsup.agent.process import TRAINER_OOM_SCORE_ADJ

    assert settings["OOMPolicy"] == "continue"  # systemd's default (stop) loses the node on one rank's OOM
    assert int(settings["OOMScoreAdjust"]) < 0 < TRAINER_OOM_SCORE_ADJ
    assert set(settings["RestartPreventExitStatus"].split()) == {str(EXIT_USAGE), str(EXIT_REFUSED)}
    assert "CAP_KILL" not in settings["CapabilityBoundingSet"]


def _bytes(value: str, ram: int = 1 << 40) -> int:
    """A systemd memory size (K/M/G/T suffixes or a percentage of `ram`) in bytes."""
    if value.endswith("%"):
        return int(float(value[:-1]) / 100 * ram)
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(float(value[:-1]) * units[value[-1]]) if value[-1] in units else int(value)


@pytest.mark.parametrize("unit", UNITS)
def test_each_unit_throttles_before_its_hard_memory_cap(unit: str) -> None:
    settings = dict(re.findall(r"^(\w+)=(.*)$", (ROOT / "systemd" / unit).read_text(), flags=re.MULTILINE))
    assert 0 < _bytes(settings["MemoryHigh"]) < _bytes(settings["MemoryMax"])
    assert settings["SystemCallErrorNumber"] == "EPERM"  # a refused call is an error, not a SIGSYS kill


def test_the_agent_leaves_the_host_room_and_the_supervisor_has_no_wx_memory() -> None:
    agent = dict(re.findall(r"^(\w+)=(.*)$", (ROOT / "systemd" / "ftsup-agent.service").read_text(), flags=re.MULTILINE))
    supervisor = dict(re.findall(r"^(\w+)=(.*)$", (ROOT / "systemd" / "ftsup-supervisor.service").read_text(),
                                 flags=re.MULTILINE))
    assert agent["MemoryMax"].endswith("%") and float(agent["MemoryMax"][:-1]) < 100
    assert "MemoryDenyWriteExecute" not in agent  # trainers JIT (triton, torch.compile)
    assert supervisor["MemoryDenyWriteExecute"] == "yes" and supervisor["PrivateUsers"] == "yes"
