"""The Prometheus scrape endpoint, served on the daemon's own asyncio loop.

prometheus_client's stock server runs in a thread and would read the runtime's mutable soft
state while the input loop changes it. Serving from the loop that owns the state makes every
scrape a consistent read without locks; a scrape costs one loop turn per request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from supervisor import logs

log = logs.get("ftsup.metrics")

HEADER_LIMIT = 64  # header lines read before giving up on a client
READ_TIMEOUT_S = 5.0


class MetricsListenError(ValueError):
    """The --metrics-listen address cannot be used; the text names it."""


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise MetricsListenError(f"--metrics-listen {listen!r} is not host:port (e.g. 127.0.0.1:9464)")
    return host.strip("[]") or "0.0.0.0", int(port)


async def serve_metrics(
    registry: CollectorRegistry, listen: str, refresh: Callable[[], Awaitable[None]] | None = None
) -> asyncio.Server:
    """Starts answering GET /metrics on `listen`; the caller closes the returned server.

    `refresh` runs before each scrape (e.g. reading new event-log records for goodput)."""
    host, port = split_listen(listen)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
            for _ in range(HEADER_LIMIT):
                line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
                if line in (b"\r\n", b"\n", b""):
                    break
            parts = request.decode("latin-1").split()
            if len(parts) < 2 or parts[0] != "GET":
                status, body, kind = "405 Method Not Allowed", b"only GET /metrics\n", "text/plain"
            elif parts[1].split("?", 1)[0] not in ("/metrics", "/"):
                status, body, kind = "404 Not Found", b"metrics are at /metrics\n", "text/plain"
            else:
                if refresh is not None:
                    await refresh()
                status, body, kind = "200 OK", generate_latest(registry), CONTENT_TYPE_LATEST
            head = f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError, ValueError, asyncio.LimitOverrunError):
            pass  # a slow, broken or oversized request: drop it, keep serving
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    try:
        server = await asyncio.start_server(answer, host, port)
    except OSError as exc:
        raise MetricsListenError(f"cannot serve metrics on {listen}: {exc}") from exc
    bound = server.sockets[0].getsockname() if server.sockets else (host, port)
    log.info("metrics served", url=f"http://{listen.rpartition(':')[0] or '0.0.0.0'}:{bound[1]}/metrics")
    return server
