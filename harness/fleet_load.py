"""Simulated agents for the fleet load bench: many Supervisor.Connect streams in one process.

Each simulated node speaks the real agent protocol on its own bidirectional stream (Hello,
Heartbeat at the Welcome's interval; once a Directive gives it ranks, per step one StepAggregate
of all its ranks, as a real agent sends to a supervisor that takes aggregates, and, with
`--snapshot-reports`, the holdings a real agent reports after every snapshot: its own ranks'
(one SnapshotHoldings), then the copies it holds as the buddy of the node its Directive's peer
grants name (a second one), or one SnapshotReport per rank and copy where the Welcome says the
supervisor does not take holdings; every copy of a step is then held twice and the step commits,
as in a real fleet, with what a commit costs the leader) and reads everything the supervisor
sends. A real agent asks for no HeartbeatAck;
one heartbeat in `--ack-every` does here (and a session's first), at a random phase per node, so
the latency of a sample of them is measured: from handing it to gRPC to reading its ack. With
`--ack-every 1` every heartbeat is acked (the bench before 2026-11-28), which costs the shards and
this generator an ack message per heartbeat that no real fleet sends. One node can be silenced — it stops
sending but keeps its stream open and keeps reading (a hung host, not a crash). A node whose
stream ends (its link shard was killed) dials its next shard as a real agent does: the replicas
that hold agents, less the ones it could not reach, by rendezvous hashing, naming the lost one in
its Hello (common/shard_map.home_of); `rehome` reports when each moved node was heard again.

Driven by `bench/scale.py` over stdin/stdout, one JSON object per line:
  out {"kind": "progress"|"ready", "welcomed": n, ...}     while connecting / once all are in
  in  {"cmd": "measure", "window_s": w, "silence": id|null, "silence_at_s": t}
  out {"kind": "result", "latencies_ms": [...], "sent": n, "acked": n, "cpu_s": s, ...}
  in  {"cmd": "rehome", "killed": address, "killed_at": unix time, "timeout_s": t}
  out {"kind": "rehome", "moved": n, "heard_again": n, "heard_again_s": [...]}  (once all are, or at t)
  in  {"cmd": "rewelcome", "killed_at": unix time, "timeout_s": t}       (the leader was SIGKILLed)
  out {"kind": "rewelcome", "nodes": n, "welcomed": n, "welcomed_s": [...], "redialled": n}
  in  {"cmd": "stop"}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field

import grpc

from ftsup.agent.link import keepalive_options
from ftsup.common import holdings_pack, step_pack
from ftsup.common.shard_map import agent_holders, shard_of
from ftsup.supervisor.server.server_limits import MAX_STREAMS_PER_CONNECTION
from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2

CONNECT_TIMEOUT_S = 600.0
# How far behind a step's boundary a node reports it, at most (each node its own lag): the ranks
# of a synchronous job leave a step's last collective together, and their agents report within
# milliseconds of each other.
STEP_SPREAD_S = 0.02
StreamCall = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.SupervisorMessage]  # Supervisor.Connect


@dataclass(slots=True)
class SimNode:
    node_id: str
    incarnation: int
    welcomed: asyncio.Event = field(default_factory=asyncio.Event)
    interval_s: float = 1.0
    generation: int = 0
    ranks: tuple[int, ...] = ()  # the ranks the Directive in force gives this node (none: not training)
    copies: tuple[int, ...] = ()  # ranks whose snapshots it holds as their node's buddy (the peer grants)
    step: int = 0
    is_silenced: bool = False
    last_beat_wall_s: float = 0.0
    last_message_wall_s: float = 0.0  # (any message: a step's report and holdings may follow the last heartbeat)
    sent_at: dict[int, float] = field(default_factory=dict)  # heartbeat seq -> loop time sent
    refusals: int = 0
    takes_holdings: bool = False  # the Welcome said the supervisor takes SnapshotHoldings
    address: str = ""  # the replica holding its stream now
    unreachable: list[str] = field(default_factory=list)  # replicas it lost, named in its next Hello
    lost: list[str] = field(default_factory=list)  # every replica whose stream of it ended (kept)
    redirect: str = ""  # a NotLeader's shard: dialled next
    lost_at_wall_s: float | None = None  # when its last stream ended (unix time)
    heard_again_wall_s: float | None = None  # its first heartbeat ack after that
    welcomed_wall_s: float | None = None  # its latest Welcome (unix time): a new leader's, after a leader change
    handed_at: float = 0.0  # (monotonic) when its last message was handed to gRPC


@dataclass(slots=True)
class Counters:
    sent: int = 0
    asked: int = 0  # heartbeats that asked for an ack
    acked: int = 0
    step_reports: int = 0  # step aggregates (one per node per step)
    snapshot_reports: int = 0  # holdings reported (per step, one per rank a node owns and one per copy it holds)
    snapshot_messages: int = 0  # messages that carried them (two per node per step where holdings are taken)
    directives: int = 0
    retains: int = 0  # SnapshotRetain notices (a commit's retain floor, in place of a directive)
    late_beats: int = 0  # heartbeats this process sent more than 10% of an interval late
    # While measuring, per node whose messages were ever more than an interval apart: its longest
    # gap between handing two messages to gRPC (what the detector can hear of it at best), and its
    # longest wait inside one write (gRPC's flow control: the receiving shard not reading).
    send_gaps_s: dict[str, float] = field(default_factory=dict)
    write_waits_s: dict[str, float] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)  # steady: before the silenced node's silence
    after_ms: list[float] = field(default_factory=list)  # after it (its detection and what follows)
    is_measuring: bool = False
    is_after: bool = False


class Fleet:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.started_wall_s = time.time()
        self.nodes = [
            SimNode(f"{args.prefix}-{i:06d}", self.rng.getrandbits(63), interval_s=args.interval_s)
            for i in range(args.first, args.first + args.count)
        ]
        self.by_id = {n.node_id: n for n in self.nodes}
        self.counters = Counters()
        self.stopping = asyncio.Event()
        self.channels: list[grpc.aio.Channel] = []
        self._open: dict[str, tuple[agent_pb2_grpc.SupervisorAsyncStub, int]] = {}  # address -> (stub, streams on it)
        self.calls: list[StreamCall] = []
        self.connect_gate = asyncio.Semaphore(args.connect_concurrency)
        self.addresses = [a for a in args.address.split(",") if a]
        self.peer_port = 0  # (run: the simulated agents' shared peer port)

    def home(self, node: SimNode) -> str:
        """The replica `node` dials: its shard (as a real agent does first: common/shard_map.py),
        less the replicas it lost."""
        if len(self.addresses) == 1:
            return self.addresses[0]
        gone = set(node.unreachable)
        candidates = (agent_holders(self.addresses, self.args.leader) - gone or set(self.addresses) - gone
                      or set(self.addresses))
        return shard_of(node.node_id, candidates)

    def stub_for(self, address: str) -> agent_pb2_grpc.SupervisorAsyncStub:
        """A stub on a channel to `address` with room for one more stream."""
        stub, streams = self._open.get(address, (None, 0))
        if stub is None or streams >= max(1, self.args.streams_per_channel):
            # A private subchannel pool: otherwise gRPC shares one HTTP/2 connection among all
            # channels to the same address, and the server's per-connection stream cap
            # (server_limits.MAX_STREAMS_PER_CONNECTION) would hold every node past it unwelcomed.
            # Pings as a real agent's (agent/link.py), here one per connection of
            # `streams_per_channel` nodes where a real agent sends one per node.
            channel = grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1),
                                                                  *keepalive_options(self.args.interval_s)])
            self.channels.append(channel)
            stub, streams = agent_pb2_grpc.SupervisorStub(channel), 0
        self._open[address] = (stub, streams + 1)
        return stub

    async def run(self) -> None:
        started = time.monotonic()
        # The simulated agents' peer service: a port that accepts, as a live agent's does, so the
        # supervisors' probes calibrate on it (supervisor/agent_probe.py) as they would on a fleet.
        peer_service = await asyncio.start_server(_hang_up, "127.0.0.1", 0)
        self.peer_port = peer_service.sockets[0].getsockname()[1]
        # Each shard's nodes share that replica's channels: placed in order, so they fill them.
        tasks = [asyncio.create_task(self.node_loop(n)) for n in sorted(self.nodes, key=self.home)]
        await self.report_connecting(started)
        await self.serve_commands()
        self.stopping.set()
        for call in self.calls:
            call.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self.channels:
            await channel.close(None)
        peer_service.close()

    async def report_connecting(self, started: float) -> None:
        while True:
            welcomed = sum(1 for n in self.nodes if n.welcomed.is_set())
            elapsed = time.monotonic() - started
            done = welcomed == len(self.nodes)
            emit({"kind": "ready" if done or elapsed > CONNECT_TIMEOUT_S else "progress", "welcomed": welcomed,
                  "nodes": len(self.nodes), "connect_s": round(elapsed, 3),
                  "refusals": sum(n.refusals for n in self.nodes), "late_beats": self.counters.late_beats})
            if done or elapsed > CONNECT_TIMEOUT_S:
                return
            await asyncio.sleep(1.0)

    async def serve_commands(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            command = json.loads(line)
            if command["cmd"] == "stop":
                return
            if command["cmd"] == "measure":
                emit(await self.measure(command["window_s"], command.get("silence"), command.get("silence_at_s", 0.0)))
            if command["cmd"] == "rehome":
                emit(await self.rehome(command["killed"], command["killed_at"], command["timeout_s"]))
            if command["cmd"] == "rewelcome":
                emit(await self.rewelcome(command["killed_at"], command["timeout_s"]))

    async def rewelcome(self, killed_at: float, timeout_s: float) -> dict[str, object]:
        """Once every node was welcomed after `killed_at` (the leader's SIGKILL: the new leader
        took it, through a kept stream or a new one), or after `timeout_s`: when each was, and how
        many had their stream ended meanwhile (and redialled)."""
        nodes = [n for n in self.nodes if not n.is_silenced]
        deadline = time.monotonic() + timeout_s
        while True:  # (polled: the nodes' clocks are read, not awaited)
            if time.monotonic() >= deadline or all(
                    n.welcomed_wall_s is not None and n.welcomed_wall_s > killed_at for n in nodes):
                break
            await asyncio.sleep(0.05)
        welcomed = [round(n.welcomed_wall_s - killed_at, 3) for n in nodes
                    if n.welcomed_wall_s is not None and n.welcomed_wall_s > killed_at]
        redialled = sum(1 for n in nodes if n.lost_at_wall_s is not None and n.lost_at_wall_s > killed_at)
        return {"kind": "rewelcome", "nodes": len(nodes), "welcomed": len(welcomed), "welcomed_s": welcomed,
                "redialled": redialled}

    async def rehome(self, killed: str, killed_at: float, timeout_s: float) -> dict[str, object]:
        """Once every node that was on `killed` (SIGKILLed at `killed_at`) is heard again
        elsewhere, or after `timeout_s`: how many moved and when each was heard again."""
        moved = [n for n in self.nodes if (killed in n.lost or n.address == killed) and not n.is_silenced]
        deadline = time.monotonic() + timeout_s
        while True:  # (polled: the nodes' clocks are read, not awaited)
            if time.monotonic() >= deadline or all(
                    n.heard_again_wall_s is not None and n.address != killed for n in moved):
                break
            await asyncio.sleep(0.05)
        heard = [round(n.heard_again_wall_s - killed_at, 3) for n in moved
                 if n.heard_again_wall_s is not None and n.address != killed]
        return {"kind": "rehome", "moved": len(moved), "heard_again": len(heard), "heard_again_s": heard,
                "still_on_killed": sum(1 for n in moved if n.address == killed)}

    async def measure(self, window_s: float, silence: str | None, silence_at_s: float) -> dict[str, object]:
        c = self.counters
        c.latencies_ms, c.after_ms, c.sent, c.acked, c.step_reports, c.late_beats = [], [], 0, 0, 0, 0
        c.asked = 0
        c.snapshot_reports = 0
        c.snapshot_messages = 0
        c.directives = c.retains = 0
        c.send_gaps_s, c.write_waits_s = {}, {}
        c.is_measuring, c.is_after = True, False
        running = sum(1 for n in self.nodes if n.ranks)
        cpu0, wall0 = time.process_time(), time.monotonic()
        stalls = asyncio.create_task(_loop_stalls())
        silenced_at_wall = None
        target = self.by_id.get(silence) if silence else None
        if target is not None:
            await asyncio.sleep(silence_at_s)
            target.is_silenced = c.is_after = True
            silenced_at_wall = target.last_beat_wall_s  # silence starts after its last heartbeat
            await asyncio.sleep(max(0.0, window_s - silence_at_s))
        else:
            await asyncio.sleep(window_s)
        _note_open_gaps(self.nodes, time.monotonic(), c)  # (silences the window's end cut short)
        c.is_measuring = False
        wall = time.monotonic() - wall0
        stalls.cancel()
        stalled = await asyncio.gather(stalls, return_exceptions=True)
        stall = stalled[0] if isinstance(stalled[0], LoopStall) else LoopStall()
        return {"kind": "result", "latencies_ms": c.latencies_ms, "after_ms": c.after_ms, "sent": c.sent,
                "asked": c.asked, "acked": c.acked,
                "step_reports": c.step_reports, "snapshot_reports": c.snapshot_reports,
                "snapshot_messages": c.snapshot_messages, "late_beats": c.late_beats,
                "directives": c.directives, "retains": c.retains,
                "cpu_s": round(time.process_time() - cpu0, 3), "wall_s": round(wall, 3),
                "welcomed": sum(1 for n in self.nodes if n.welcomed.is_set()),
                "running": running,
                # this process's own loop: the longest it ran late (a starved generator sends late,
                # and its nodes look silent to the detector) and when (wall clock)
                "loop_max_stall_s": round(stall.max_s, 3), "loop_max_stall_at_wall_s": stall.at_wall_s,
                "loop_stalls_over_1s": stall.over_1s,
                # the nodes this process itself left silent longest (top MAX_GAPS_REPORTED)
                "send_gaps_s": _longest(c.send_gaps_s), "write_waits_s": _longest(c.write_waits_s),
                "silenced": silence if target is not None else None, "last_beat_wall_s": silenced_at_wall,
                # read at the window's end: a step's writes under way at the silence still went out
                "last_message_wall_s": target.last_message_wall_s if target is not None else None}

    async def node_loop(self, node: SimNode) -> None:
        """Sessions until stopped: a stream that ends moves the node to its next shard (a silenced
        node, hung, does not come back)."""
        while not self.stopping.is_set():
            node.address, node.redirect = node.redirect or self.home(node), ""
            # Refused or reset: as a real agent, the next Hello names it (agent/link.py); a
            # refusal ("retry later") or a NotLeader ends the stream cleanly and names nothing.
            unreachable = await self.session(node, self.stub_for(node.address)) == grpc.StatusCode.UNAVAILABLE
            if self.stopping.is_set() or node.is_silenced:
                return
            node.lost_at_wall_s, node.heard_again_wall_s = time.time(), None
            if unreachable and node.address not in node.unreachable:
                node.unreachable.append(node.address)
            node.lost.append(node.address)
            node.welcomed.clear()
            await asyncio.sleep(self.rng.uniform(0.05, 0.2))  # an agent's first reconnect backoff

    async def session(self, node: SimNode, stub: agent_pb2_grpc.SupervisorAsyncStub) -> grpc.StatusCode:
        """One stream, until it ends; returns its final status (UNAVAILABLE: refused or reset)."""
        call = stub.Connect(None)  # None: written below
        self.calls.append(call)
        tasks: list[asyncio.Task[None]] = []
        try:
            async with self.connect_gate:
                await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(
                    node_id=node.node_id, incarnation=node.incarnation, role=events_pb2.NODE_ROLE_ACTIVE,
                    host="127.0.0.1", peer_port=self.peer_port, gpus=8, agent_version="sim", failure_domain="",
                    unreachable_replicas=node.unreachable,
                    # (a second Welcome is handled as the first: holdings go every step anyway)
                    resyncs_on_welcome=not self.args.old_agents,
                    takes_snapshot_retain=not self.args.old_agents)))
                reader = asyncio.create_task(self.read(node, call))
                tasks.append(reader)
                welcomed = asyncio.create_task(node.welcomed.wait())
                await asyncio.wait({reader, welcomed}, return_when=asyncio.FIRST_COMPLETED)
                welcomed.cancel()
            if not reader.done():
                node.unreachable = []  # (as an agent's Welcome clears them)
                tasks.append(asyncio.create_task(self.beat(node, call)))
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass  # (a write to a stream that ended: its status below says how it ended)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if not call.done():
            call.cancel()
        return await call.code()

    async def beat(self, node: SimNode, call: StreamCall) -> None:
        loop = asyncio.get_running_loop()
        c = self.counters
        seq = 0
        # The first beat goes at once (as a real agent's does), the next at a random phase, which
        # spreads the fleet's heartbeats over the interval.
        next_beat = next_step = loop.time()
        phase_s = self.rng.uniform(0.0, node.interval_s)
        epoch_s = self.args.step_epoch_s or self.started_wall_s
        spread_s = self.rng.uniform(0.0, STEP_SPREAD_S)  # this node's lag behind each step's boundary
        ack_every = max(1, self.args.ack_every)
        ack_phase = self.rng.randrange(ack_every)
        while not self.stopping.is_set():
            if node.is_silenced:
                await self.stopping.wait()  # hung: the stream stays open, nothing more is sent
                return
            now = loop.time()
            if now >= next_beat:
                seq += 1
                if now - next_beat > 0.1 * node.interval_s:
                    c.late_beats += 1
                # (a session's first asks too: a moved node's "heard again" is its first ack)
                want_ack = seq == 1 or seq % ack_every == ack_phase
                if want_ack:
                    node.sent_at[seq] = now
                    c.asked += 1
                node.last_beat_wall_s = node.last_message_wall_s = time.time()
                await self.send(node, call, agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(
                    seq=seq, running_generation=node.generation if node.ranks else 0, want_ack=want_ack)))
                c.sent += 1
                next_beat = max(next_beat + node.interval_s, now) if seq > 1 else now + phase_s
            step_s = self.args.step_s
            if node.ranks and step_s > 0 and now >= next_step:
                # A synchronous job's nodes finish step k together: every node reports the step
                # whose boundary (from the bench's common epoch, wall clock) passed, a few ms apart.
                wall = time.time()
                boundary = int((wall - epoch_s) // step_s)
                if node.step and boundary > node.step:
                    node.step = boundary
                    await self.report_step(node, call, step_s)
                elif not node.step:
                    node.step = boundary  # (ranks just came: the first step reported is the next)
                next_step = now + (epoch_s + (boundary + 1) * step_s + spread_s - wall)
            wake = min(next_beat, next_step) if node.ranks and step_s > 0 else next_beat
            await asyncio.sleep(max(0.0, wake - loop.time()))

    async def send(self, node: SimNode, call: StreamCall, message: agent_pb2.AgentMessage) -> None:
        """Writes one of `node`'s messages after its Hello, noting (while measuring) how long the
        node had been silent at the source and how long gRPC held the write."""
        c = self.counters
        handed = time.monotonic()
        last, node.handed_at = node.handed_at, handed
        if c.is_measuring and last:
            _note_gap(node, handed - last, c)
        await call.write(message)
        waited = time.monotonic() - handed
        if c.is_measuring and waited > 0.1 and waited > c.write_waits_s.get(node.node_id, 0.0):
            c.write_waits_s[node.node_id] = waited

    async def report_step(self, node: SimNode, call: StreamCall, step_s: float) -> None:
        """One step of every rank the node runs, as a real agent reports it: one aggregate, then
        (with --snapshot-reports) the node's holding of each of its ranks' snapshots and of each
        copy it holds for the node it backs up: a SnapshotHoldings of each where the Welcome said
        the supervisor takes them, else one report each. (A real buddy reports its copies once
        they arrived, ~1 s after the owner's on a GPU host; here right behind them.)"""
        reports = [agent_pb2.StepReport(generation=node.generation, rank=rank, step=node.step, step_time_s=step_s,
                                        compute_time_s=0.8 * step_s, loss=1.0, param_digest="0" * 32)
                   for rank in node.ranks]
        node.last_message_wall_s = time.time()
        await self.send(node, call, agent_pb2.AgentMessage(step_aggregate=step_pack.pack(reports)))
        self.counters.step_reports += 1
        if not self.args.snapshot_reports or not node.ranks:
            return
        for ranks in (node.ranks, node.copies):
            held = [agent_pb2.SnapshotReport(generation=node.generation, rank=rank, step=node.step,
                                             holder_node_ids=[node.node_id], size_bytes=1 << 30, sha256=f"{rank:064x}")
                    for rank in ranks]
            if not held:
                continue
            messages = ([agent_pb2.AgentMessage(snapshot_holdings=holdings_pack.pack(held))] if node.takes_holdings
                        else [agent_pb2.AgentMessage(snapshot_report=report) for report in held])
            for message in messages:
                node.last_message_wall_s = time.time()
                await self.send(node, call, message)
            self.counters.snapshot_reports += len(held)
            self.counters.snapshot_messages += len(messages)

    async def read(self, node: SimNode, call: StreamCall) -> None:
        loop = asyncio.get_running_loop()
        c = self.counters
        async for message in call:
            kind = message.WhichOneof("kind")
            if kind == "heartbeat_ack":
                sent = node.sent_at.pop(message.heartbeat_ack.seq, None)
                if sent is not None:
                    c.acked += 1
                    if node.lost_at_wall_s is not None and node.heard_again_wall_s is None:
                        node.heard_again_wall_s = time.time()
                    if c.is_measuring:
                        (c.after_ms if c.is_after else c.latencies_ms).append(round((loop.time() - sent) * 1000.0, 2))
            elif kind == "welcome":
                if message.welcome.heartbeat_interval_s > 0:
                    node.interval_s = message.welcome.heartbeat_interval_s
                node.takes_holdings = message.welcome.takes_snapshot_holdings
                node.welcomed_wall_s = time.time()
                node.welcomed.set()
            elif kind == "directive":
                c.directives += 1
                d = message.directive
                if d.action == agent_pb2.ACTION_RUN and d.ranks:
                    if node.generation != d.generation:
                        node.step = d.restore_step if d.HasField("restore_step") else 0
                    node.generation, node.ranks = d.generation, tuple(d.ranks)
                    node.copies = tuple(sorted(r for grant in d.peer_grants for r in grant.store_ranks))
                else:
                    node.generation, node.ranks, node.copies = d.generation, (), ()
            elif kind == "snapshot_retain":
                c.retains += 1  # (the floor only bounds a real agent's RAM: nothing to keep here)
            elif kind == "refusal":
                node.refusals += 1
            elif kind == "not_leader":
                node.redirect = message.not_leader.shard_address or message.not_leader.leader_address
            if len(node.sent_at) > 64:  # acks that never came: keep the map bounded
                for seq in sorted(node.sent_at)[:-64]:
                    del node.sent_at[seq]


@dataclass
class LoopStall:
    max_s: float = 0.0
    at_wall_s: float | None = None
    over_1s: int = 0


STALL_PROBE_S = 0.05


async def _loop_stalls() -> LoopStall:
    """How late this process's event loop wakes a 50 ms sleep, until cancelled: its worst and when."""
    loop = asyncio.get_running_loop()
    stall = LoopStall()
    try:
        while True:
            asked = loop.time()
            await asyncio.sleep(STALL_PROBE_S)
            late = loop.time() - asked - STALL_PROBE_S
            if late > 1.0:
                stall.over_1s += 1
            if late > stall.max_s:
                stall.max_s, stall.at_wall_s = late, time.time() - late
    except asyncio.CancelledError:
        return stall


def _note_open_gaps(nodes: list[SimNode], now: float, counters: Counters) -> None:
    """At the window's end, each node silent for more than an interval since it last handed a
    message to gRPC (a silenced node aside: its silence is the test's) counts that silence as a
    gap too: its next message, which would have closed it, comes after the window."""
    for node in nodes:
        if node.handed_at and not node.is_silenced:
            _note_gap(node, now - node.handed_at, counters)


def _note_gap(node: SimNode, gap: float, counters: Counters) -> None:
    """Keeps `gap` as `node`'s longest silence at the source if it is longer than an interval."""
    if gap > node.interval_s and gap > counters.send_gaps_s.get(node.node_id, 0.0):
        counters.send_gaps_s[node.node_id] = gap


# Nodes reported per result in send_gaps_s and write_waits_s at most (the longest first).
MAX_GAPS_REPORTED = 2_000


def _longest(by_node: dict[str, float]) -> dict[str, float]:
    longest = sorted(by_node.items(), key=lambda item: item[1], reverse=True)[:MAX_GAPS_REPORTED]
    return {node: round(seconds, 3) for node, seconds in longest}


def emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ftsup.harness.fleet_load", description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True,
                   help="supervisor host:port; several (comma-separated): replicas with link shards, each node"
                        " dialling its shard")
    p.add_argument("--first", type=int, default=0, help="index of this process's first node")
    p.add_argument("--count", type=int, required=True, help="nodes simulated by this process")
    p.add_argument("--prefix", default="sim")
    p.add_argument("--interval-s", type=float, default=1.0, help="until the Welcome names the interval")
    p.add_argument("--step-s", type=float, default=10.0, help="one StepAggregate per node per step (0: none)")
    p.add_argument("--step-epoch-s", type=float, default=0.0,
                   help="wall-clock time step boundaries count from, shared by every load process (0: this one's start)")
    p.add_argument("--snapshot-reports", action="store_true",
                   help="per step, the node's holding of each rank it owns (its RAM snapshot) and of each copy it"
                        " holds as a buddy: a SnapshotHoldings of each where the supervisor takes them, else one"
                        " SnapshotReport per rank and copy (every step commits)")
    p.add_argument("--old-agents", action="store_true",
                   help="agents before 2026-11-28: they do not resync on a second Welcome (a shard ends their"
                        " streams at a leader change instead of keeping them) nor take a SnapshotRetain (a commit"
                        " sends each a whole directive)")
    p.add_argument("--leader", default="", help="the leading replica's address: it holds no agents from 3 replicas"
                   " (common/shard_map.agent_holders), so nodes dial a follower's link shard")
    p.add_argument("--streams-per-channel", type=int, default=25, help="streams sharing one HTTP/2 connection (at most the server's per-connection cap)")
    p.add_argument("--connect-concurrency", type=int, default=200, help="Hellos not yet welcomed at once")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ack-every", type=int, default=1,
                   help="one heartbeat in N asks for an ack (and a session's first); real agents ask none")
    return p


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A probe's connection to a simulated agent's peer port: nothing to say."""
    writer.close()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.count < 1 or args.interval_s <= 0 or args.step_s < 0 or not 1 <= args.streams_per_channel <= MAX_STREAMS_PER_CONNECTION:
        print(f"fleet_load: bad arguments {vars(args)}", file=sys.stderr)
        return 2
    asyncio.run(Fleet(args).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
