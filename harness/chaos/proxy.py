"""A TCP proxy that can partition one agent from the supervisor and heal it again.

Owns a listening socket and, per accepted connection, one upstream connection. `partition()`
stops forwarding in both directions without closing anything: sockets stay open, bytes pile up
in kernel buffers, new connections wait in the accept backlog. That is what a network partition
looks like to both ends (silence, not a reset), so the supervisor must judge the node on
heartbeat silence, not on a closed stream. `heal()` forwards again, including what piled up.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field

_CHUNK = 64 * 1024
_MAX_BUFFERED = 4 * 1024 * 1024  # per direction: stop reading a side whose peer is not draining


@dataclass(eq=False)
class _Pipe:
    """One proxied connection: bytes read from `a` go to `b` and back."""

    a: socket.socket
    b: socket.socket
    to_b: bytearray = field(default_factory=bytearray)
    to_a: bytearray = field(default_factory=bytearray)


class PartitionProxy:
    """Forwards 127.0.0.1:<port> to `upstream` ("HOST:PORT") on a background thread."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"upstream must be HOST:PORT, got {upstream!r}")
        self._upstream = (host, int(port))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._pipes: list[_Pipe] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._cut = threading.Event()  # set: drop every open connection on the next pass
        self.cuts = 0  # connections dropped by cut()
        self._thread = threading.Thread(target=self._run, name=f"partition-proxy-{self.address}", daemon=True)
        self._thread.start()

    @property
    def is_partitioned(self) -> bool:
        return not self._flowing.is_set()

    def partition(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def cut(self, timeout_s: float = 5.0) -> None:
        """A network blip: every open connection through the proxy is closed at once (both ends
        see EOF or a reset); new connections are accepted as before. Returns once it happened."""
        self._cut.set()
        deadline = time.monotonic() + timeout_s
        while self._cut.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._cut.is_set():
            raise TimeoutError(f"the proxy at {self.address} did not cut its connections in {timeout_s:g}s")

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._thread.join(timeout=5)
        for pipe in self._pipes:
            pipe.a.close()
            pipe.b.close()
        self._listener.close()

    def __enter__(self) -> PartitionProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the forwarding loop (its own thread; the only code touching the sockets) ---------------
    def _run(self) -> None:
        while not self._closed.is_set():
            if not self._flowing.is_set():
                self._flowing.wait(0.2)  # partitioned: read nothing, write nothing, accept nothing
                continue
            readers: list[socket.socket] = [self._listener]
            writers: list[socket.socket] = []
            for pipe in self._pipes:
                if len(pipe.to_b) < _MAX_BUFFERED:
                    readers.append(pipe.a)
                if len(pipe.to_a) < _MAX_BUFFERED:
                    readers.append(pipe.b)
                if pipe.to_b:
                    writers.append(pipe.b)
                if pipe.to_a:
                    writers.append(pipe.a)
            readable, writable, _ = select.select(readers, writers, [], 0.1)
            if self._cut.is_set():
                for pipe in list(self._pipes):
                    self._drop(pipe)
                    self.cuts += 1
                self._cut.clear()
                continue
            if not self._flowing.is_set():
                continue  # partitioned while waiting: what is ready stays in the kernel buffers
            if self._listener in readable:
                self._accept()
            for pipe in list(self._pipes):
                if not self._pump(pipe, readable, writable):
                    self._drop(pipe)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            upstream = socket.create_connection(self._upstream, timeout=5)
        except OSError:
            client.close()  # upstream down: the client sees a reset, as without the proxy
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._pipes.append(_Pipe(client, upstream))

    def _pump(self, pipe: _Pipe, readable: list[socket.socket], writable: list[socket.socket]) -> bool:
        """Moves bytes one round; False once either side closed or failed."""
        try:
            for source, buffer in ((pipe.a, pipe.to_b), (pipe.b, pipe.to_a)):
                if source in readable:
                    data = source.recv(_CHUNK)
                    if not data:
                        return False
                    buffer.extend(data)
            for sink, buffer in ((pipe.b, pipe.to_b), (pipe.a, pipe.to_a)):
                if sink in writable and buffer:
                    sent = sink.send(buffer)
                    del buffer[:sent]
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return True

    def _drop(self, pipe: _Pipe) -> None:
        self._pipes.remove(pipe)
        pipe.a.close()
        pipe.b.close()
