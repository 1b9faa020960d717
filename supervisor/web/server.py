"""The supervisor's status page: a read-only HTTP(S) listener on the daemon's own loop.

Same listener rule as /metrics (common/metrics_http.py): with the daemon's TLS files it is HTTPS
and the browser must present a client certificate from the CA; beyond the handshake this page
asks for an *operator* certificate (read or admin role, as `supervisorctl status` would), since it
shows node names, hosts and reasons an agent's certificate has no business reading. Without TLS it
is plain HTTP on loopback only (reach it through an SSH tunnel), unless --insecure.

Live updates are server-sent events: each page holds one stream that starts with the whole state
(fleet, summary, recent records) and then carries the event log's follow, a fleet diff when the
folded state moved, and a summary every SUMMARY_PERIOD_S. Nothing polls. Memory is bounded on
both ends: a stream's queue holds at most QUEUE_RECORDS records and a client that stops reading
for WRITE_TIMEOUT_S is dropped (its EventSource reconnects and starts over from a fresh state);
at most MAX_STREAMS streams are served at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from importlib import resources
from typing import TYPE_CHECKING, Any

from ftsup.common import logs, tls
from ftsup.common.deadline import within
from ftsup.common.tls import PeerKind
from ftsup.supervisor.core.events import Record
from ftsup.supervisor.eventlog.api import LogError
from ftsup.supervisor.server.log_digest import LogDigest
from ftsup.supervisor.web import feed

if TYPE_CHECKING:
    from ftsup.supervisor.runtime import Runtime

log = logs.get("ftsup.status")

HEADER_LIMIT = 64
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_STREAMS = 64
QUEUE_RECORDS = 2000
BATCH_RECORDS = 500  # records per "events" message
TICK_S = 0.25  # how often a stream looks for a moved fleet
SUMMARY_PERIOD_S = 1.0
RECENT_RECORDS = 500  # records a new page starts with
NODE_RECORDS_SCANNED = 20_000  # how far back a node's detail view looks for its events

STATIC = {
    "status.js": "text/javascript; charset=utf-8",
    "status.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}


class StatusListenError(ValueError):
    """The --status-listen address cannot be used; the text names it."""


def check_status_listen(listen: str, files: tls.TlsFiles | None, *, is_insecure_allowed: bool) -> None:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise StatusListenError(f"--status-listen {listen!r} is not host:port (e.g. 127.0.0.1:9465)")
    if files is None and not is_insecure_allowed and not tls.is_loopback(listen):
        raise StatusListenError(
            f"--status-listen {listen} is not loopback and no TLS is configured: pass --tls-cert/--tls-key/--tls-ca"
            " to serve the status page over HTTPS (browsers then present an operator certificate, `ftsup certs"
            f" --operators NAME:read`), listen on loopback (127.0.0.1:{port}) and tunnel to it, or pass"
            " --insecure to serve plain HTTP on the network")


def _static(name: str) -> bytes:
    return resources.files("ftsup.supervisor.web").joinpath("static", name).read_bytes()


class _Response(Exception):
    """A short answer that ends the request (errors, refusals)."""

    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class StatusServer:
    """Answers the page, its static files, three JSON reads and the event stream."""

    def __init__(self, runtime: Runtime, *, is_tls: bool) -> None:
        self.runtime = runtime
        self.is_tls = is_tls
        metrics = runtime.metrics
        self.digest = metrics.goodput if metrics is not None else LogDigest()
        self.streams = 0

    # -- request handling -----------------------------------------------------------------------
    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await within(reader.readline(), READ_TIMEOUT_S)
            for _ in range(HEADER_LIMIT):
                line = await within(reader.readline(), READ_TIMEOUT_S)
                if line in (b"\r\n", b"\n", b""):
                    break
            parts = request.decode("latin-1").split()
            try:
                if len(parts) < 2 or parts[0] != "GET":
                    raise _Response("405 Method Not Allowed", "the status page is read-only: GET only\n")
                self._authorize(writer)
                url = urllib.parse.urlsplit(parts[1])
                await self._route(url.path, urllib.parse.parse_qs(url.query), writer)
            except _Response as answer:
                await _send(writer, answer.status, "text/plain; charset=utf-8", answer.text.encode())
        except (TimeoutError, OSError, ValueError, asyncio.LimitOverrunError):
            pass  # slow, broken or oversized: drop it, keep serving
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _authorize(self, writer: asyncio.StreamWriter) -> None:
        if not self.is_tls:
            return  # loopback (or --insecure): the listen check decided who can reach us
        ssl_object: ssl.SSLObject | None = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        identity = tls.identity_of_cert(ssl.DER_cert_to_PEM_cert(der).encode()) if der else None
        if identity is None or identity.kind is not PeerKind.OPERATOR:
            raise _Response("403 Forbidden", f"the status page needs an operator certificate (read or admin role);"
                            f" this one is {identity or 'not an ftsup identity'}\n")

    async def _route(self, path: str, query: dict[str, list[str]], writer: asyncio.StreamWriter) -> None:
        if path in ("/", "/status"):
            if path == "/":
                raise _Response("404 Not Found", "the status page is at /status\n")
            await _send(writer, "200 OK", "text/html; charset=utf-8", _static("index.html"))
        elif path.startswith("/status/static/"):
            name = path.removeprefix("/status/static/")
            if name not in STATIC:
                raise _Response("404 Not Found", f"no static file {name!r}\n")
            await _send(writer, "200 OK", STATIC[name], _static(name), cache=True)
        elif path == "/status/api/state":
            await _send_json(writer, await self.state())
        elif path == "/status/api/node":
            node_id = (query.get("id") or [""])[0]
            details = feed.node_json(self.runtime, node_id)
            if details is None:
                raise _Response("404 Not Found", f"no node {node_id!r}\n")
            details["events"] = feed.recent_records(self._tail(NODE_RECORDS_SCANNED), node_id, limit=50)
            await _send_json(writer, details)
        elif path == "/status/api/record":
            await _send_json(writer, self._record(query))
        elif path == "/status/api/stream":
            await self._stream(writer)
        else:
            raise _Response("404 Not Found", "the status page is at /status\n")

    def _record(self, query: dict[str, list[str]]) -> dict[str, Any]:
        raw = (query.get("seq") or [""])[0]
        if not raw.isdigit():
            raise _Response("400 Bad Request", f"seq must be a positive integer, got {raw!r}\n")
        seq = int(raw)
        try:
            record = next(iter(self.runtime.event_log.read(seq)), None)
        except LogError as exc:
            raise _Response("404 Not Found", f"record {seq}: {exc}\n") from exc
        if record is None or record.seq != seq:
            raise _Response("404 Not Found", f"no record {seq} (the head is {self.runtime.event_log.head_seq})\n")
        return feed.record_json(record)

    def _tail(self, count: int) -> list[Record]:
        event_log = self.runtime.event_log
        since = max(event_log.first_seq, event_log.head_seq - count + 1, 1)
        try:
            return list(event_log.read(since))
        except LogError:
            return []

    async def state(self) -> dict[str, Any]:
        """Everything a new page draws first."""
        await self.digest.catch_up(self.runtime.event_log)
        recent = [r for r in self._tail(RECENT_RECORDS * 4) if type(r.event).__name__ not in feed.QUIET_KINDS]
        return {
            "fleet": feed.fleet(self.runtime.state),
            "summary": feed.summary(self.runtime, self.digest),
            "events": [feed.record_json(r) for r in recent[-RECENT_RECORDS:]],
            "head_seq": self.runtime.event_log.head_seq,
        }

    # -- the event stream -----------------------------------------------------------------------
    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        if self.streams >= MAX_STREAMS:
            raise _Response("503 Service Unavailable", f"{MAX_STREAMS} status streams are open already\n")
        self.streams += 1
        queue: asyncio.Queue[Record | None] = asyncio.Queue(maxsize=QUEUE_RECORDS)
        pump: asyncio.Task[None] | None = None
        try:
            head = ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
                    "Connection: close\r\nX-Accel-Buffering: no\r\n\r\n")
            writer.write(head.encode("latin-1") + b"retry: 2000\n\n")
            first = await self.state()
            applied = self.runtime.state.applied_seq
            codes = feed.fleet_codes(self.runtime.state)
            await _event(writer, "state", first)
            pump = asyncio.create_task(_pump(self.runtime.event_log.follow(first["head_seq"] + 1), queue))
            loop = asyncio.get_running_loop()
            next_summary = loop.time() + SUMMARY_PERIOD_S
            while True:
                batch, is_ended = await _take(queue, TICK_S)
                if batch:
                    await _event(writer, "events", [feed.record_json(r) for r in batch
                                                    if type(r.event).__name__ not in feed.QUIET_KINDS])
                if self.runtime.state.applied_seq != applied:
                    applied = self.runtime.state.applied_seq
                    now_codes = feed.fleet_codes(self.runtime.state)
                    changes = feed.fleet_changes(codes, now_codes)
                    if changes is None:
                        await _event(writer, "fleet", feed.fleet(self.runtime.state))
                    elif changes:
                        await _event(writer, "nodes", changes)
                    codes = now_codes
                if loop.time() >= next_summary:
                    next_summary = loop.time() + SUMMARY_PERIOD_S
                    await self.digest.catch_up(self.runtime.event_log)
                    await _event(writer, "summary", feed.summary(self.runtime, self.digest))
                if is_ended:
                    return  # the log cannot be followed from here (compacted): the page reconnects
        finally:
            self.streams -= 1
            if pump is not None:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)


async def _pump(records: AsyncIterator[Record], queue: asyncio.Queue[Record | None]) -> None:
    try:
        async for record in records:
            await queue.put(record)
    except LogError as exc:
        log.info("status stream stops following the log", reason=str(exc))
    await queue.put(None)


async def _take(queue: asyncio.Queue[Record | None], wait_s: float) -> tuple[list[Record], bool]:
    """Up to BATCH_RECORDS records, waiting at most `wait_s` for the first, and whether the pump
    ended (the log cannot be followed from here any more)."""
    try:
        item = await within(queue.get(), wait_s)
    except TimeoutError:
        return [], False
    batch: list[Record] = []
    while item is not None:
        batch.append(item)
        if len(batch) >= BATCH_RECORDS or queue.empty():
            return batch, False
        item = queue.get_nowait()
    return batch, True


async def _event(writer: asyncio.StreamWriter, name: str, data: Any) -> None:
    body = json.dumps(data, separators=(",", ":"), allow_nan=False)
    writer.write(f"event: {name}\ndata: {body}\n\n".encode())
    await within(writer.drain(), WRITE_TIMEOUT_S)


async def _send(writer: asyncio.StreamWriter, status: str, kind: str, body: bytes, *, cache: bool = False) -> None:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
            f"Cache-Control: {'max-age=3600' if cache else 'no-store'}\r\nX-Content-Type-Options: nosniff\r\n"
            "Content-Security-Policy: default-src 'self'; style-src 'self' 'unsafe-inline'\r\n"
            "Connection: close\r\n\r\n")
    writer.write(head.encode("latin-1") + body)
    await within(writer.drain(), WRITE_TIMEOUT_S)


async def _send_json(writer: asyncio.StreamWriter, data: Any) -> None:
    await _send(writer, "200 OK", "application/json", json.dumps(data, allow_nan=False).encode())


async def serve_status(runtime: Runtime, listen: str, *, tls_files: tls.TlsFiles | None = None) -> asyncio.Server:
    """Starts the status page on `listen`; the caller closes the returned server."""
    host, _, port = listen.rpartition(":")
    context = tls.server_ssl_context(tls_files) if tls_files is not None else None
    handler = StatusServer(runtime, is_tls=context is not None)
    try:
        server = await asyncio.start_server(handler.answer, host.strip("[]") or "0.0.0.0", int(port), ssl=context,
                                            ssl_handshake_timeout=READ_TIMEOUT_S if context else None)
    except OSError as exc:
        raise StatusListenError(f"cannot serve the status page on {listen}: {exc}") from exc
    bound = server.sockets[0].getsockname() if server.sockets else (host, port)
    scheme = "https" if context is not None else "http"
    log.info("status page served", url=f"{scheme}://{host or '0.0.0.0'}:{bound[1]}/status",
             client_certificates="operator certificate required" if context is not None else "none (plain HTTP)")
    return server
