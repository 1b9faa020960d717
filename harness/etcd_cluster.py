"""A real 3-member etcd cluster on loopback for integration tests, benchmarks and `ftsup chaos`.

Owns the member processes (Debian's `etcd`, 3.4), their data dirs and logs. Health is waited for
by polling `etcdctl endpoint health` against a deadline, never by sleeping. Faults: stop (SIGTERM)
or kill a member, restart it on its data dir (`--initial-cluster-state existing`), SIGSTOP/SIGCONT.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field

from ftsup.harness import orphan_guard, ports

HEALTH_DEADLINE_S = 20.0


class EtcdClusterError(RuntimeError):
    """The cluster could not be started or did not become healthy in time."""


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports, each reserved machine-wide until this process exits (harness/ports.py)."""
    return [ports.reserve(1).first for _ in range(count)]


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    process: subprocess.Popen[bytes] | None = None
    is_paused: bool = False

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class EtcdCluster:
    """`size` members under `root`; start() brings them up, close() kills everything."""

    root: pathlib.Path
    size: int = 3
    members: list[Member] = field(default_factory=list)
    token: str = field(default_factory=lambda: f"ftsup-{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        if shutil.which("etcd") is None or shutil.which("etcdctl") is None:
            raise EtcdClusterError("etcd/etcdctl not on PATH: apt-get install -y etcd-server etcd-client")
        ports = free_ports(2 * self.size)
        self.members = [Member(f"e{i + 1}", ports[2 * i], ports[2 * i + 1]) for i in range(self.size)]

    # -- addresses -------------------------------------------------------------------------
    @property
    def endpoints(self) -> str:
        """etcdctl form: http://127.0.0.1:P1,http://127.0.0.1:P2,..."""
        return ",".join(m.client_url for m in self.members)

    @property
    def client_target(self) -> tuple[str, int]:
        """aetcd's multi-address form: host 'ipv4:127.0.0.1:P1,127.0.0.1:P2,127.0.0.1', port P3."""
        *head, last = self.members
        host = "ipv4:" + ",".join([f"127.0.0.1:{m.client_port}" for m in head] + ["127.0.0.1"])
        return host, last.client_port

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Starts every member and waits until all are healthy. One that does not finish (an error,
        a stop signal) kills the members it started: a caller's `with` never saw them."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            for member in self.members:
                self._spawn(member, state="new")
            self.wait_healthy()
        except BaseException:
            self._kill_members()
            raise

    def _spawn(self, member: Member, *, state: str) -> None:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        argv = [
            "etcd", "--name", member.name, "--data-dir", str(self.root / member.name),
            "--listen-client-urls", member.client_url, "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url, "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", initial, "--initial-cluster-token", self.token,
            "--initial-cluster-state", state,
            "--logger", "zap", "--log-outputs", str(self.root / f"{member.name}.log"),
        ]  # fmt: skip
        member.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        orphan_guard.watch(member.process)
        member.is_paused = False

    def healthy(self, member: Member) -> bool:
        result = subprocess.run(
            ["etcdctl", "--dial-timeout=200ms", "--command-timeout=1s", "--endpoints", member.client_url,
             "endpoint", "health"],
            capture_output=True, env={**os.environ, "ETCDCTL_API": "3"}, check=False,
        )  # fmt: skip
        return result.returncode == 0

    def wait_healthy(self, names: list[str] | None = None, deadline_s: float = HEALTH_DEADLINE_S) -> None:
        """Polls until the named (default: all running) members report healthy (quorum included)."""
        chosen = [m for m in self.members if (names is None and m.is_running) or (names and m.name in names)]
        deadline = time.monotonic() + deadline_s
        pending = list(chosen)
        while pending:
            pending = [m for m in pending if not self.healthy(m)]
            for member in pending:
                if not member.is_running:
                    log_path = self.root / f"{member.name}.log"
                    tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
                    raise EtcdClusterError(f"etcd member {member.name} exited; {log_path} ends:\n{tail}")
            if pending and time.monotonic() > deadline:
                names_left = [m.name for m in pending]
                raise EtcdClusterError(f"etcd members {names_left} not healthy within {deadline_s}s ({self.root})")

    def leader_name(self) -> str:
        """The member that is currently the raft leader (via `etcdctl endpoint status`)."""
        result = subprocess.run(
            ["etcdctl", "--dial-timeout=200ms", "--command-timeout=1s", "--endpoints", self.endpoints,
             "endpoint", "status", "-w", "fields"],
            capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"}, check=False,
        )  # fmt: skip
        endpoint, leader_ids, member_ids = [], [], []
        for line in result.stdout.splitlines():
            key, _, value = line.partition(" : ")
            key, value = key.strip().strip('"'), value.strip().strip('"')
            if key == "Endpoint":
                endpoint.append(value)
            elif key == "MemberID":
                member_ids.append(value)
            elif key == "Leader":
                leader_ids.append(value)
        for url, member_id in zip(endpoint, member_ids):
            if leader_ids and member_id == leader_ids[0]:
                return next(m.name for m in self.members if m.client_url == url)
        raise EtcdClusterError(f"no etcd leader found: {result.stdout!r} {result.stderr!r}")

    # -- faults ----------------------------------------------------------------------------
    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        member = self.member(name)
        if member.process is not None and member.process.poll() is None:
            if member.is_paused:
                member.process.send_signal(signal.SIGCONT)
            member.process.send_signal(sig)
            member.process.wait(timeout=10)
        member.is_paused = False

    def stop(self, name: str) -> None:
        self.kill(name, signal.SIGTERM)

    def restart(self, name: str, *, wait: bool = True) -> None:
        member = self.member(name)
        if member.is_running:
            raise EtcdClusterError(f"member {name} is still running")
        self._spawn(member, state="existing")
        if wait:
            self.wait_healthy([name])

    def pause(self, name: str) -> None:
        member = self.member(name)
        assert member.process is not None
        member.process.send_signal(signal.SIGSTOP)
        member.is_paused = True

    def resume(self, name: str) -> None:
        member = self.member(name)
        assert member.process is not None
        member.process.send_signal(signal.SIGCONT)
        member.is_paused = False

    def heal(self) -> None:
        """Brings every member back (resumed or restarted) and waits for health."""
        for member in self.members:
            if member.is_paused:
                self.resume(member.name)
            elif not member.is_running:
                self._spawn(member, state="existing")
        self.wait_healthy()

    def close(self) -> None:
        self._kill_members()
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_members(self) -> None:
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                if member.is_paused:
                    member.process.send_signal(signal.SIGCONT)
                member.process.kill()
                member.process.wait(timeout=10)

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tmpfs_root(tag: str = "etcd") -> pathlib.Path:
    """A fresh directory on /dev/shm when available (fast fsync), else the system temp dir."""
    import tempfile

    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return pathlib.Path(tempfile.mkdtemp(prefix=f"ftsup-{tag}-", dir=base))
