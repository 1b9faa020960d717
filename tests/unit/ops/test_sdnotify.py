"""sd_notify against a real unix datagram socket, as systemd would receive it."""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import uuid
from collections.abc import Iterator

import pytest

from ftsup.common.sdnotify import Notifier, pet_watchdog


@pytest.fixture
def receiver(tmp_path: pathlib.Path) -> Iterator[tuple[socket.socket, str]]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5.0)  # a deadline for each datagram, never a sleep
    yield sock, str(path)
    sock.close()


def fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().split("\n"))


def test_ready_sends_ready_status_and_mainpid_in_one_datagram(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert notifier.ready("serving on 127.0.0.1:7070")
    got = fields(sock.recv(4096))
    assert got == {"READY": "1", "STATUS": "serving on 127.0.0.1:7070", "MAINPID": str(os.getpid())}
    assert notifier.stopping()
    assert fields(sock.recv(4096))["STOPPING"] == "1"
    notifier.close()


def test_an_abstract_namespace_socket_is_reached_through_the_at_sign() -> None:
    name = f"ftsup-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5.0)
    try:
        notifier = Notifier.from_env({"NOTIFY_SOCKET": f"@{name}"})
        assert notifier.status("following leader")
        assert sock.recv(4096) == b"STATUS=following leader"
        notifier.close()
    finally:
        sock.close()


def test_without_notify_socket_every_call_is_a_silent_no_op() -> None:
    notifier = Notifier.from_env({})
    assert not notifier.is_enabled
    assert not notifier.ready("x") and not notifier.watchdog()
    assert notifier.watchdog_interval_s is None


def test_watchdog_interval_is_half_the_timeout_and_honours_watchdog_pid(receiver: tuple[socket.socket, str]) -> None:
    _, path = receiver
    assert Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000"}).watchdog_interval_s == 5.0
    other_pid = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert Notifier.from_env(other_pid).watchdog_interval_s is None  # the watchdog is someone else's
    mine = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier.from_env(mine).watchdog_interval_s == 5.0


async def test_pet_watchdog_keeps_sending_watchdog_from_the_event_loop(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "40000"})  # pet every 20 ms
    task = asyncio.create_task(pet_watchdog(notifier))
    loop = asyncio.get_running_loop()
    try:
        for _ in range(3):
            assert await loop.run_in_executor(None, sock.recv, 4096) == b"WATCHDOG=1"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        notifier.close()


async def test_pet_watchdog_returns_at_once_without_a_watchdog(receiver: tuple[socket.socket, str]) -> None:
    _, path = receiver
    await asyncio.wait_for(pet_watchdog(Notifier.from_env({"NOTIFY_SOCKET": path})), timeout=1.0)


def test_a_relative_notify_socket_is_rejected_naming_it() -> None:
    with pytest.raises(ValueError, match="relative.sock"):
        Notifier("relative.sock")


def test_a_vanished_socket_is_not_fatal(tmp_path: pathlib.Path) -> None:
    assert not Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}).ready("x")
