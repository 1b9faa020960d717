"""The Prometheus scrape endpoint, served on the daemon's own asyncio loop.

prometheus_client's stock server runs in a thread and would read the runtime's mutable soft
state while the input loop changes it. Serving from the loop that owns the state makes every
scrape a consistent read without locks; a scrape costs one loop turn per request.

Same rule as the gRPC listeners (common/tls.py): with the daemon's TLS files it is HTTPS and
requires a client certificate signed by the CA (any ftsup identity may scrape: metrics are
read-only and hold no secrets); without them it serves plain HTTP on loopback only, unless
`--insecure` said the network is trusted (`check_metrics_listen`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ftsup.common import logs, tls
from ftsup.common.deadline import within

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


def check_metrics_listen(listen: str, files: tls.TlsFiles | None, *, is_insecure_allowed: bool) -> None:
    """Refuses plain HTTP beyond loopback unless --insecure; with TLS any address is fine."""
    _, port = split_listen(listen)
    if files is None and not is_insecure_allowed and not tls.is_loopback(listen):
        raise MetricsListenError(
            f"--metrics-listen {listen} is not loopback and no TLS is configured: pass --tls-cert/--tls-key/--tls-ca"
            " to serve /metrics over HTTPS (scrapers then present a certificate from that CA, e.g. `ftsup certs"
            f" --operators prometheus:read`), listen on loopback (127.0.0.1:{port}), or pass --insecure to serve"
            " plain HTTP on the network"
        )


async def serve_metrics(
    registry: CollectorRegistry, listen: str, refresh: Callable[[], Awaitable[None]] | None = None,
    *, tls_files: tls.TlsFiles | None = None,
) -> asyncio.Server:
    """Starts answering GET /metrics on `listen`; the caller closes the returned server.

    `refresh` runs before each scrape (e.g. reading new event-log records for goodput). With
    `tls_files` it is HTTPS and a client certificate signed by their CA is required."""
    host, port = split_listen(listen)
    context = tls.server_ssl_context(tls_files) if tls_files is not None else None

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await within(reader.readline(), READ_TIMEOUT_S)
            for _ in range(HEADER_LIMIT):
                line = await within(reader.readline(), READ_TIMEOUT_S)
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
        except (TimeoutError, OSError, ValueError, asyncio.LimitOverrunError):
            pass  # a slow, broken (TLS included) or oversized request: drop it, keep serving
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    try:
        server = await asyncio.start_server(answer, host, port, ssl=context,
                                            ssl_handshake_timeout=READ_TIMEOUT_S if context else None)
    except OSError as exc:
        raise MetricsListenError(f"cannot serve metrics on {listen}: {exc}") from exc
    bound = server.sockets[0].getsockname() if server.sockets else (host, port)
    scheme = "https" if context is not None else "http"
    log.info("metrics served", url=f"{scheme}://{listen.rpartition(':')[0] or '0.0.0.0'}:{bound[1]}/metrics",
             client_certificates="required" if context is not None else "none (plain HTTP)")
    return server
