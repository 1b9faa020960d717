"""The leader's lease, refreshed from a thread of its own.

A leader's event loop does heavy synchronous work at the worst moments: a generation start for
12,500 nodes builds and encodes every directive (~3 s on a busy machine), a new leader rebuilds
its view, Python collects garbage. A keepalive that is one more task on that loop misses its
refresh during such a stall, the 2 s lease expires, another replica takes over and inherits the
same stall: measured with 3,000 simulated nodes over 3 replicas, leadership changed every few
seconds and every change ended every agent stream. Refreshing from a thread with its own
(synchronous) gRPC channel to etcd keeps the lease as long as the *process* lives and reaches
etcd, which is what the lease is meant to say. A leader stalled meanwhile cannot do harm: every
append is fenced on the leader key's revision (supervisor/eventlog/etcd.py). A loop stuck for good
(a deadlock, a gRPC call that never returns) must not keep leadership for as long as the process
lives: given `loop_seen` (when the loop last ran), the thread stops refreshing once the loop has
not run for `max_loop_stall_s`, and the lease lapses within its TTL.

The decisions stay pure (`supervisor.leader_view`: `after_keepalive`, `leads_at`, `next_refresh_in`);
this module only runs them on a timer. The loop reads `view` (replaced whole, never mutated: a
reference assignment, atomic under the GIL) and is told of a loss through `on_lost`, which the
caller makes thread-safe (`loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

import grpc
from aetcd import rpc

from ftsup.supervisor.leader_view import LeaseView, after_keepalive, is_loop_wedged, leads_at, next_refresh_in

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Refreshes `lease_id` at TTL/3 until stopped or the lease is lost (then `on_lost(why)`, once)."""

    def __init__(self, channel: Callable[[], grpc.Channel], lease_id: int, view: LeaseView, *, timeout_s: float,
                 on_lost: Callable[[str], object], clock: Callable[[], float] = time.monotonic, name: str = "",
                 loop_seen: Callable[[], float] | None = None, max_loop_stall_s: float = math.inf) -> None:
        self._channel = channel
        self._loop_seen = loop_seen
        self._max_loop_stall_s = max_loop_stall_s
        self._lease_id = lease_id
        self.view = view
        self._timeout_s = timeout_s
        self._on_lost = on_lost
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-keeper {name}".strip(), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops refreshing (the caller revokes or lets the lease lapse); returns within a refresh call."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._timeout_s + 1.0)

    def _run(self) -> None:
        channel = self._channel()
        try:
            stub = rpc.LeaseStub(channel)
            failed = False
            while not self._stop.wait(next_refresh_in(self.view, failed=failed)):
                sent_at = self._clock()
                if self._loop_seen is not None and is_loop_wedged(self._loop_seen(), sent_at, self._max_loop_stall_s):
                    log.warning("the event loop has not run for %.1fs: letting the lease lapse",
                                sent_at - self._loop_seen())
                    if not self._stop.is_set():
                        self._on_lost("the event loop is wedged")
                    return
                granted = self._refresh(stub)
                failed = granted is None
                self.view = after_keepalive(self.view, sent_at, granted)
                if not leads_at(self.view, self._clock()):
                    if not self._stop.is_set():
                        self._on_lost("lease revoked" if self.view.is_revoked else "no refresh within the TTL")
                    return
        finally:
            channel.close()

    def _refresh(self, stub: rpc.LeaseStub) -> int | None:
        """One LeaseKeepAlive round trip: the granted TTL (<= 0: the lease is gone), None if it failed."""
        try:
            replies = stub.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=self._lease_id)]), timeout=self._timeout_s)
            for reply in replies:
                return int(reply.TTL)
        except grpc.RpcError as exc:
            log.info("lease refresh failed: %s", exc.code() if isinstance(exc, grpc.Call) else exc)
        return None
