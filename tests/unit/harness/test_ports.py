"""The harness's port rule: outside the ephemeral range, one owner per port machine-wide, dead owners reclaimed."""

from __future__ import annotations

import pathlib
import random
import socket
import subprocess

import pytest

from ftsup.harness.ports import (
    UNREGISTERED_DEFAULTS,
    PortRegistry,
    PortsExhausted,
    candidate_ranges,
    ephemeral_range,
    is_bindable,
)

EPHEMERAL = (32768, 60999)


def registry(root: pathlib.Path, seed: int = 1) -> PortRegistry:
    return PortRegistry(root, rng=random.Random(seed), ephemeral=EPHEMERAL)


def test_reserved_ports_avoid_the_ephemeral_range(tmp_path: pathlib.Path) -> None:
    reg = registry(tmp_path)
    for _ in range(20):
        r = reg.reserve(8)
        assert all(not EPHEMERAL[0] <= p <= EPHEMERAL[1] for p in r.ports), r
        assert not set(r.ports) & set(range(29400, 30000)), r  # torch's fixed defaults


def test_two_sessions_never_get_overlapping_ports(tmp_path: pathlib.Path) -> None:
    # Same seed: both would pick the same first candidate; the registry makes the second move on.
    first, second = registry(tmp_path, seed=3), registry(tmp_path, seed=3)
    a, b = first.reserve(64), second.reserve(64)
    assert not set(a.ports) & set(b.ports)


def test_a_dead_owners_reservation_is_reclaimed(tmp_path: pathlib.Path) -> None:
    child = subprocess.Popen(["true"])
    reg = registry(tmp_path)
    held = reg.reserve(4, owner_pid=child.pid)
    assert held in reg.held()
    child.wait()
    assert held not in reg.held()
    assert not (tmp_path / held.file_name).exists()


def _listening_below_the_ephemeral_range() -> tuple[socket.socket, int]:
    """A socket bound to a port P whose neighbour P+1 is free, both below the kernel's ephemeral
    range: no other process is handed ports there at random (a bind(0) port's neighbour is in the
    ephemeral range, where any outgoing connection of a busy machine may take it)."""
    low_ephemeral = ephemeral_range()[0]
    for port in range(max(1024, low_ephemeral - 4000), low_ephemeral - 2, 7):
        if UNREGISTERED_DEFAULTS.start - 1 <= port < UNREGISTERED_DEFAULTS.stop:
            continue
        taken = socket.socket()
        try:
            taken.bind(("127.0.0.1", port))
        except OSError:
            taken.close()
            continue
        if is_bindable(port + 1):
            return taken, port
        taken.close()
    raise AssertionError("no free pair of ports below the ephemeral range")


def test_a_port_someone_listens_on_is_skipped(tmp_path: pathlib.Path) -> None:
    taken, port = _listening_below_the_ephemeral_range()
    try:
        # The only candidates are `port` (someone listens) and `port + 1`.
        reg = PortRegistry(tmp_path, ephemeral=(port + 2, 65535), lowest=port)
        assert reg.reserve(1).first == port + 1
        with pytest.raises(PortsExhausted):
            reg.reserve(1, attempts=20)
    finally:
        taken.close()


def test_no_room_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    assert candidate_ranges((10000, 65535), 1) == []
    with pytest.raises(PortsExhausted, match="ephemeral"):
        PortRegistry(tmp_path, ephemeral=(10000, 65535)).reserve(1)
    with pytest.raises(ValueError, match="1..4096"):
        registry(tmp_path).reserve(0)


def test_release_frees_the_ports(tmp_path: pathlib.Path) -> None:
    reg = registry(tmp_path)
    r = reg.reserve(2)
    reg.release(r)
    assert reg.held() == []


def test_torchs_fixed_default_ports_are_never_handed_out(tmp_path: pathlib.Path) -> None:
    # Candidates start at 29390..29412 for 8 ports: only 29390..29392 stay clear of 29400.
    reg = PortRegistry(tmp_path, rng=random.Random(5), ephemeral=(29420, 65535), lowest=29390)
    assert reg.reserve(8).first in (29390, 29391, 29392)


def _claim_many(root: str, ready, done, out, count: int) -> None:  # a forked process: one test session
    reg = registry(pathlib.Path(root), seed=7)  # every process draws the same candidates, in the same order
    ready.wait()
    out.put([r.first for r in (reg.reserve(1) for _ in range(count))])
    done.wait()  # alive until all have claimed: a dead owner's ports are free to take again


def test_concurrent_sessions_never_hand_out_the_same_port(tmp_path: pathlib.Path) -> None:
    """Four processes claim at once from one registry, each drawing the same candidates: the lock
    around scan-and-claim is all that keeps them apart."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    sessions, count = 4, 10
    ready, done, out = context.Barrier(sessions), context.Barrier(sessions + 1), context.Queue()
    processes = [context.Process(target=_claim_many, args=(str(tmp_path), ready, done, out, count))
                 for _ in range(sessions)]
    for process in processes:
        process.start()
    try:
        claimed = [port for _ in processes for port in out.get(timeout=60)]
        done.wait(timeout=60)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    assert len(claimed) == sessions * count
    assert len(set(claimed)) == len(claimed), sorted(p for p in set(claimed) if claimed.count(p) > 1)


# Binding port 0 to learn a free port and closing the socket hands out an ephemeral port that is
# nobody's until the child binds it (the EADDRINUSE issue 16 saw). Ports come from harness/ports.py
# (free_port, ports.reserve) or are bound and held (grpc's add_insecure_port(":0")); these hold theirs:
BINDS_AND_HOLDS = {
    "harness/chaos/proxy.py",  # the partition proxy listens on its socket for its whole life
    "tests/unit/harness/test_ports.py",  # holds a listening socket to show a taken port is skipped
}


def test_no_port_is_picked_by_binding_port_zero_and_letting_go() -> None:
    import ast

    root = pathlib.Path(__file__).resolve().parents[3]
    offenders = []
    for folder in ("common", "checkpoint", "supervisor", "agent", "trainer", "harness", "bench", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            name, text = str(path.relative_to(root)), path.read_text()
            if ".bind(" not in text:
                continue
            for node in ast.walk(ast.parse(text)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bind"
                        and node.args and isinstance(node.args[0], ast.Tuple) and len(node.args[0].elts) == 2
                        and isinstance(node.args[0].elts[1], ast.Constant) and node.args[0].elts[1].value == 0
                        and name not in BINDS_AND_HOLDS):
                    offenders.append(f"{name}:{node.lineno}")
    assert not offenders, f"ports picked by bind-to-0-and-close (use ftsup.harness.cluster.free_port): {offenders}"
