"""A small threaded HTTP proxy in front of the S3 server that injects faults into chosen requests.

Faults: answer 500/503 with an S3 error body, delay the answer (slow server), or drop the
connection after part of the request body arrived (a dropped connection mid-upload). Requests pass
through byte-for-byte otherwise: the Host header is kept, so SigV4 signatures made for the proxy's
address still verify upstream. Rules match on method and a regex over the path + query and fire a
given number of times; each rule counts its hits so a test can assert the fault really happened.
Only bodies framed by Content-Length are supported (what boto3 sends); anything else gets a 501.
One implementation for the integration tests (tests/support/s3_fault_proxy.py re-exports it) and
the `s3_errors` chaos scenario, which points a whole job's checkpoint store at it.
"""

from __future__ import annotations

import enum
import http.client
import http.server
import re
import socket
import threading
import time
from dataclasses import dataclass, field

_HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "expect", "transfer-encoding", "te", "upgrade"}


class Fault(enum.Enum):
    STATUS_500 = 500
    STATUS_503 = 503
    DELAY = "delay"
    DROP = "drop"


@dataclass
class FaultRule:
    fault: Fault
    method: str | None = None  # None = any
    path: str = ""  # regex searched in "path?query"
    times: int | None = 1  # how many matching requests to hit; None = every one
    skip: int = 0  # let this many matching requests through first
    delay_s: float = 0.0  # Fault.DELAY
    drop_after_bytes: int = 1024  # Fault.DROP: body bytes read before the connection is dropped
    hits: int = 0
    first_hit_at: float | None = None  # wall clock (time.time()) of the first hit, as the event log stamps
    seen: int = field(default=0, repr=False)

    def claims(self, method: str, path: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        if self.path and not re.search(self.path, path):
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.hits >= self.times):
            return False
        self.hits += 1
        if self.first_hit_at is None:
            self.first_hit_at = time.time()
        return True


class FaultProxy:
    """Listens on a free loopback port and forwards to `upstream` ("host:port")."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.rules: list[FaultRule] = []
        self.requests: list[tuple[str, str, str]] = []  # (method, path, outcome), when answered
        self.arrived: list[tuple[str, str]] = []  # (method, path), as soon as the headers arrive
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, rule: FaultRule) -> FaultRule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def remove(self, rule: FaultRule) -> None:
        """Stop injecting `rule` (its counts stay readable)."""
        with self._lock:
            self.rules = [r for r in self.rules if r is not rule]

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _match(self, method: str, path: str) -> FaultRule | None:
        with self._lock:
            for rule in self.rules:
                if rule.claims(method, path):
                    return rule
        return None

    def _arrive(self, method: str, path: str) -> None:
        with self._lock:
            self.arrived.append((method, path))

    def _record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.requests.append((method, path, outcome))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, and 100-continue answered for boto3's Expect header

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _handle(self) -> None:
        method, path, owner = self.command, self.path, self.owner
        owner._arrive(method, path)
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self._read_body(0)
            self._reply(501, b"chunked request bodies are not supported by the fault proxy")
            owner._record(method, path, "501")
            return
        length = int(self.headers.get("Content-Length") or 0)
        rule = owner._match(method, path)
        if rule is not None and rule.fault is Fault.DROP:
            self._read_body(min(length, rule.drop_after_bytes))
            owner._record(method, path, "dropped")
            self.close_connection = True
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        body = self._read_body(length)
        if rule is not None and rule.fault in (Fault.STATUS_500, Fault.STATUS_503):
            status = rule.fault.value
            code = "InternalError" if status == 500 else "ServiceUnavailable"
            xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                   f"<Message>injected by the fault proxy</Message></Error>").encode()
            self._reply(status, xml, content_type="application/xml")
            owner._record(method, path, str(status))
            return
        if rule is not None and rule.fault is Fault.DELAY:
            time.sleep(rule.delay_s)  # the fault itself: a slow server, not a wait in a test
        status = self._forward(method, path, body)
        owner._record(method, path, f"{'delayed ' if rule else ''}{status}")

    def _read_body(self, length: int) -> bytes:
        chunks, left = [], length
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response_only(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self, method: str, path: str, body: bytes) -> int | str:
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_HEADERS:
                    conn.putheader(name, value)
            conn.endheaders(body if body or method in ("PUT", "POST") else None)
            response = conn.getresponse()
            data = response.read()
            try:
                self.send_response_only(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() in _HOP_HEADERS or (name.lower() == "content-length" and method != "HEAD"):
                        continue
                    self.send_header(name, value)
                if method != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if method != "HEAD":
                    self.wfile.write(data)
            except OSError:
                return f"{response.status} (client gone)"
            return response.status
        except OSError as exc:
            self._reply(502, f"fault proxy could not reach upstream: {exc}".encode())
            return 502
        finally:
            conn.close()
