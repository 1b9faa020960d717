"""Is a node's agent gone? One TCP connect to its peer port, after its stream closed.

A closed stream is suspected at once but declared dead only after the reconnect grace (0.4 s
by default), which covers a stream that broke while its agent lives (a network blip, a shard's
restart): that agent redials within the grace. When the agent process itself is gone nothing
can reconnect within the grace (an agent takes seconds to start), and the grace is ~40 % of a
warm recovery (docs/peers.md, run G2). The agent's peer service listens for as long as the agent
lives, so a refused connect to it (the node's kernel answering RST: nothing listens) says the
process is gone; the detector then declares the node dead without the grace (`AgentGone`;
AGENT_GONE_SETTLE_S after the close, so nodes failing together are one restart). Anything else
(accepted, a timeout: a machine without power or a partition answers nothing, an unreachable
route) says nothing, and the grace decides as before. The connect carries no bytes: a TLS peer
server sees a connection closed before its handshake.

A refusal is trusted only from a node whose peer port this supervisor has seen accept a
connection while its stream was open ("calibrated"): a firewall that rejects the supervisors'
connections to the peer ports (an iptables REJECT answers as a closed port does) would otherwise
turn every closed stream into an immediate death. Nodes are calibrated after their Hello is
admitted, CALIBRATE_PER_TICK per tick: a 12,500-node fleet in ~80 s at 0.1 s ticks, a trickle of
~160 connects/s (a few percent of the leader's core) rather than a burst while the fleet
registers. Until then, and for a node whose port did not answer, the grace decides.

With link shards (issue 14) each shard probes the agents whose streams it holds: it calibrates
them after their Welcome, probes after a close and forwards a refusal to the leader
(Forwarded.agent_gone), which decides it as its own probe's. The leader probes only its own share
(and the nodes of a shard too old to say it probes), so calibrating a 12,500-node fleet costs the
leader nothing and each shard its share.

Bounded: one probe per node at a time, at most MAX_PROBES in flight (the rest wait out the
grace, or their calibration the next tick), each within its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from ftsup.common import logs
from ftsup.common.deadline import within

MAX_PROBES = 256
CALIBRATE_PER_TICK = 16
CALIBRATE_TIMEOUT_S = 1.0
VERDICT_RETRY_S = 0.05  # a closed stream's port accepting is tried again this often,
VERDICT_WINDOW_S = 0.5  # for at most this long (and within the grace): a dying process's teardown

log = logs.get("supervisor.agent_probe")


async def refused(host: str, port: int, timeout_s: float) -> str:
    """Why the agent at host:port is known gone ("" when that is not known) after one connect."""
    try:
        _, writer = await within(asyncio.open_connection(host, port), timeout_s)
    except TimeoutError:
        return ""  # no answer (no power, a partition): the grace decides
    except OSError as exc:
        if isinstance(exc, ConnectionRefusedError) or exc.errno == errno.ECONNREFUSED:
            return f"its agent's peer port {host}:{port} refuses connections (the agent process is gone)"
        return ""  # unreachable, or no answer: the grace decides
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return ""


class AgentProbes:
    """The runtime's probes: calibration after admission, the verdict probe after a close."""

    def __init__(self, generation: Callable[[], int | None] = lambda: None) -> None:
        self._generation = generation  # the generation in force, for log lines (every node line names it)
        self._in_flight: dict[str, asyncio.Task[None]] = {}  # node -> its one probe
        self._calibrated: set[str] = set()  # peer port seen accepting while its stream was open
        self._waiting: deque[str] = deque()  # admitted, not yet calibrated
        self._queued: set[str] = set()

    def admitted(self, node_id: str) -> None:
        """A Hello was admitted (its peer port may be new): calibrate it again."""
        self._calibrated.discard(node_id)
        if node_id not in self._queued:
            self._queued.add(node_id)
            self._waiting.append(node_id)

    def is_calibrated(self, node_id: str) -> bool:
        return node_id in self._calibrated

    def calibrate(self, address_of: Callable[[str], tuple[str, int] | None]) -> None:
        """Starts up to CALIBRATE_PER_TICK calibrations; `address_of` gives a node's peer address
        while its stream is open (None: skip it; it is queued again at its next Hello)."""
        started = 0
        while self._waiting and started < CALIBRATE_PER_TICK and len(self._in_flight) < MAX_PROBES:
            node_id = self._waiting.popleft()
            self._queued.discard(node_id)
            address = address_of(node_id)
            if address is None or node_id in self._in_flight:
                continue
            started += 1
            self._start(node_id, self._calibration(node_id, *address))

    def after_close(self, node_id: str, address: tuple[str, int], timeout_s: float,
                    gone: Callable[[str], None]) -> bool:
        """A node's stream closed: probe once if it is calibrated; `gone(detail)` when its port
        refuses. False when no probe was started (the reconnect grace decides)."""
        if node_id not in self._calibrated:
            # (debug: at a fleet's teardown every uncalibrated node says so, 3,000 lines in 3 s)
            log.debug("agent probe: not probing a closed stream's node", node_id=node_id,
                      generation=self._generation(), why="not calibrated")
            return False
        if node_id in self._in_flight or len(self._in_flight) >= MAX_PROBES:
            log.info("agent probe: not probing a closed stream's node", node_id=node_id, generation=self._generation(),
                     why="a probe in flight or too many")
            return False
        self._start(node_id, self._verdict(node_id, *address, timeout_s, gone, self._generation))
        return True

    def cancel(self) -> None:
        for task in list(self._in_flight.values()):
            task.cancel()

    def in_flight(self) -> int:
        return len(self._in_flight)

    def pending(self) -> int:
        """Nodes admitted and not yet tried for calibration."""
        return len(self._waiting)

    def _start(self, node_id: str, work: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            try:
                await work
            finally:
                self._in_flight.pop(node_id, None)

        self._in_flight[node_id] = asyncio.get_running_loop().create_task(run(), name=f"agent-probe-{node_id}")

    async def _calibration(self, node_id: str, host: str, port: int) -> None:
        try:
            _, writer = await within(asyncio.open_connection(host, port), CALIBRATE_TIMEOUT_S)
        except OSError as exc:  # TimeoutError included
            # (debug: a fleet behind a firewall would log one line per node)
            log.debug("agent probe: this supervisor cannot reach the node's peer port; its closed streams"
                      " wait out the reconnect grace", node_id=node_id, address=f"{host}:{port}", error=repr(exc),
                      generation=self._generation())
            return
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        self._calibrated.add(node_id)

    @staticmethod
    async def _verdict(node_id: str, host: str, port: int, timeout_s: float, gone: Callable[[str], None],
                       generation: Callable[[], int | None] = lambda: None) -> None:
        """Connects, and while the port still accepts, again every VERDICT_RETRY_S for up to
        VERDICT_WINDOW_S within the grace: a SIGKILLed node's stream can be seen closed before its last thread has
        exited and the kernel has closed the listener (accepted in 2 of 4 kills on a loaded
        2-core machine with one try). An agent that lives accepts every time, so trying again
        never turns a live agent into a gone one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeout_s, VERDICT_WINDOW_S)
        tries = 0
        while True:
            tries += 1
            detail = await refused(host, port, max(0.01, deadline - loop.time()))
            if detail or loop.time() + VERDICT_RETRY_S >= deadline:
                break
            await asyncio.sleep(VERDICT_RETRY_S)
        log.info("agent probe after a closed stream", node_id=node_id, address=f"{host}:{port}",
                 agent_gone=bool(detail), tries=tries, generation=generation())
        if detail:
            gone(detail)
