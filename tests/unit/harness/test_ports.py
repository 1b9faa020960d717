"""The harness's port rule: outside the ephemeral range, one owner per port machine-wide, dead owners reclaimed."""

from __future__ import annotations

import pathlib
import random
import socket
import subprocess

import pytest

from ftsup.harness.ports import PortRegistry, PortsExhausted, candidate_ranges

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


def test_a_port_someone_listens_on_is_skipped(tmp_path: pathlib.Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    port = taken.getsockname()[1]
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
