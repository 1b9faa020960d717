"""The built wheel installs beside PyPI's `supervisor` (supervisord) in one venv: both import and run,
and uninstalling ftsup leaves supervisord whole. Before the `ftsup.` namespace both shipped a
top-level `supervisor/` package that merged into one directory."""

from __future__ import annotations

import os
import pathlib
import site
import subprocess
import sys
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# `make` downloads PyPI's supervisord wheel here (tests run offline against it).
WHEELS = ROOT / ".venv" / "wheels"

pytestmark = pytest.mark.integration


def run(*argv: str | pathlib.Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # Never from the checkout: there `python -c` would find the repository's own folders first.
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, env=env, cwd="/")
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def package_files(site_packages: pathlib.Path, name: str) -> dict[str, bytes]:
    return {str(p.relative_to(site_packages)): p.read_bytes() for p in sorted((site_packages / name).rglob("*.py"))}


def test_the_wheel_lives_beside_supervisord_and_uninstalls_cleanly(tmp_path):
    supervisord_wheels = sorted(WHEELS.glob("supervisor-*.whl"))
    assert supervisord_wheels, f"no supervisord wheel in {WHEELS}: run `make test` (it downloads it once)"
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, ROOT)
    (wheel,) = dist.glob("ftsup-*.whl")

    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    python = target / "bin" / "python"
    fresh_site = pathlib.Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    # ftsup's own dependencies (grpcio, torch, ...) come from this venv, read-only; ftsup does not.
    (fresh_site / "deps-from-test-venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}

    run(python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", supervisord_wheels[-1], env=env)
    supervisord_before = package_files(fresh_site, "supervisor")
    run(python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel, env=env)

    assert package_files(fresh_site, "supervisor") == supervisord_before, "ftsup wrote into supervisord's package"
    assert not (fresh_site / "agent").exists() and not (fresh_site / "trainer").exists()
    assert run(target / "bin" / "supervisord", "--version", env=env).stdout.strip().startswith("4.")
    assert "commands:" in run(target / "bin" / "ftsup", "--help", env=env).stdout
    ours = run(target / "bin" / "supervisorctl", "--help", env=env).stdout
    assert "ftsup supervisor" in ours
    assert "ftsup supervisor" in run(target / "bin" / "ftsup", "ctl", "--help", env=env).stdout
    imports = "import supervisor.supervisord, ftsup.supervisor.runtime, ftsup.trainer.session; print(supervisor.__file__)"
    assert run(python, "-c", imports, env=env).stdout.strip().startswith(str(fresh_site))

    run(python, "-m", "pip", "uninstall", "-q", "-y", "ftsup", env=env)
    assert package_files(fresh_site, "supervisor") == supervisord_before
    assert run(target / "bin" / "supervisord", "--version", env=env).stdout.strip().startswith("4.")
    gone = subprocess.run([python, "-c", "import ftsup"], capture_output=True, text=True, env=env, cwd="/")
    assert gone.returncode != 0 and "No module named 'ftsup'" in gone.stderr
