"""Collision-free loopback ports for the harness, across every test session on this machine.

The rule: a port the harness hands out (a supervisor's listen address, a job's master-port span,
an etcd member's, an offline reference's rendezvous) is (1) outside the kernel's ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range), so no outgoing connection of any process can take it
between our check and the child's bind, and outside 29400-29999 (torch's and a job file's fixed
default ports, which other processes bind without asking) (the EADDRINUSE once seen at a rendezvous port: a
`bind(0)` port is an ephemeral one, and the master-port span overlapped that range), (2) recorded
in a registry under /tmp (one file per reservation, naming its owner's pid and start time) while
its owner lives, so two sessions never hand out the same port, and (3) bindable at reservation.
A reservation ends when its owner releases it, or when the owner process is gone (a killed
session's reservations are reclaimed by the next one that scans: pid liveness plus start time,
so a reused pid does not keep a dead session's ports).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import pathlib
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass

# Below 10000 sit well-known services (and this harness's users' own daemons); above the
# ephemeral range there may be no room at all.
LOWEST_PORT = 10000
HIGHEST_PORT = 65535
EPHEMERAL_RANGE_PATH = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range")
# Fixed defaults others bind without asking the registry: torchrun's rendezvous (29400), torch's
# MASTER_PORT (29500) and a job file's default master-port span (29500 + 500).
UNREGISTERED_DEFAULTS = range(29400, 30000)


class PortsExhausted(RuntimeError):
    """No free run of ports of the asked length outside the ephemeral range and the registry."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """`count` consecutive ports from `first`, held by process `pid` (started at `start_ticks`)."""

    first: int
    count: int
    pid: int
    start_ticks: int

    @property
    def ports(self) -> range:
        return range(self.first, self.first + self.count)

    @property
    def file_name(self) -> str:
        return f"{self.first}-{self.count}"

    def overlaps(self, first: int, count: int) -> bool:
        return first < self.first + self.count and self.first < first + count


def ephemeral_range(path: pathlib.Path = EPHEMERAL_RANGE_PATH) -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive); Linux's default when it cannot be read."""
    try:
        low, high = (int(part) for part in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def candidate_ranges(ephemeral: tuple[int, int], count: int, lowest: int = LOWEST_PORT) -> list[tuple[int, int]]:
    """The [low, high] spans a run of `count` ports may start in, outside the ephemeral range."""
    low_e, high_e = ephemeral
    spans = []
    if low_e - count >= lowest:
        spans.append((lowest, low_e - count))
    if high_e + 1 <= HIGHEST_PORT - count + 1:
        spans.append((max(high_e + 1, lowest), HIGHEST_PORT - count + 1))
    return spans


def process_start_ticks(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None when gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def is_alive(reservation: Reservation) -> bool:
    return process_start_ticks(reservation.pid) == reservation.start_ticks


def is_bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


class PortRegistry:
    """The machine-wide registry of reserved ports (a directory; an flock makes scan-and-claim atomic)."""

    def __init__(self, root: pathlib.Path | None = None, *, rng: random.Random | None = None,
                 ephemeral: tuple[int, int] | None = None, lowest: int = LOWEST_PORT) -> None:
        self.root = root or pathlib.Path("/tmp") / f"ftsup-ports-{os.getuid()}"
        self.root.mkdir(parents=True, exist_ok=True)
        self._rng = rng or random.Random()
        self._ephemeral = ephemeral
        self._lowest = lowest

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def held(self) -> list[Reservation]:
        """Reservations whose owner still lives; dead owners' files are removed on the way."""
        live = []
        for path in self.root.iterdir():
            if path.name.startswith("."):
                continue
            try:
                first, count = (int(x) for x in path.name.split("-"))
                pid, ticks = (int(x) for x in path.read_text().split())
            except (OSError, ValueError):
                continue  # not ours, or being written under another lock holder: never ours to delete
            reservation = Reservation(first, count, pid, ticks)
            if is_alive(reservation):
                live.append(reservation)
            else:
                path.unlink(missing_ok=True)
        return live

    def reserve(self, count: int = 1, *, owner_pid: int | None = None, attempts: int = 200) -> Reservation:
        """Claims `count` consecutive ports no live reservation holds, all bindable now."""
        if not 1 <= count <= 4096:
            raise ValueError(f"a reservation is 1..4096 ports, got {count}")
        pid = owner_pid or os.getpid()
        ticks = process_start_ticks(pid)
        if ticks is None:
            raise ValueError(f"owner pid {pid} is not running")
        spans = candidate_ranges(self._ephemeral or ephemeral_range(), count, self._lowest)
        if not spans:
            raise PortsExhausted(f"no room for {count} ports outside the ephemeral range {self._ephemeral}")
        with self._locked():
            taken = self.held()
            for _ in range(attempts):
                low, high = self._rng.choice(spans)
                first = self._rng.randint(low, high)
                if any(r.overlaps(first, count) for r in taken):
                    continue
                if first < UNREGISTERED_DEFAULTS.stop and UNREGISTERED_DEFAULTS.start < first + count:
                    continue
                if not all(is_bindable(port) for port in range(first, first + count)):
                    continue
                reservation = Reservation(first, count, pid, ticks)
                (self.root / reservation.file_name).write_text(f"{pid} {ticks}\n")
                return reservation
        raise PortsExhausted(f"no free run of {count} ports after {attempts} tries ({len(taken)} reservations held"
                             f" in {self.root})")

    def release(self, reservation: Reservation) -> None:
        with self._locked():
            (self.root / reservation.file_name).unlink(missing_ok=True)


_registry: PortRegistry | None = None
_mine: list[Reservation] = []


def registry() -> PortRegistry:
    """This process's handle on the machine-wide registry; its reservations are released at exit."""
    global _registry
    if _registry is None:
        _registry = PortRegistry()
        atexit.register(_release_all)
    return _registry


def reserve(count: int = 1) -> Reservation:
    reservation = registry().reserve(count)
    _mine.append(reservation)
    return reservation


def release(reservation: Reservation) -> None:
    if reservation in _mine:
        _mine.remove(reservation)
    registry().release(reservation)


def _release_all() -> None:
    for reservation in list(_mine):
        with contextlib.suppress(OSError):
            release(reservation)
