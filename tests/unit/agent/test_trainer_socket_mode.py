"""The trainer-link socket is the agent user's alone, whatever umask the agent started with."""

from __future__ import annotations

import os
import pathlib
import stat

import grpc

from ftsup.agent.main import start_private_unix_server


async def test_the_trainer_socket_is_mode_0600_even_under_a_permissive_umask(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "agent.sock"
    previous = os.umask(0)  # the worst case: the socket would be srwxrwxrwx
    server = grpc.aio.server()
    try:
        await start_private_unix_server(server, path)
    finally:
        os.umask(previous)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert os.umask(previous) == previous  # the process umask is back as it was
    finally:
        await server.stop(0)
