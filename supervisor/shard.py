"""A follower replica's link shard: holds its share of the agents' streams and relays them.

Borg's design (issue 14, docs/scale.md): every replica talks to a subset of the fleet (its nodes
by rendezvous hashing, common/shard_map.py), so the leader's one Python process handles one
stream per follower instead of one per node. A shard decides nothing: it forwards to the leader,
over one LinkShard.Relay stream, everything its agents send that can change a decision (Hellos,
reports, the end of a stream: supervisor/shard_queue.py; heartbeats as a liveness summary every
20 ms on a stream of their own, or folded per node to a leader that predates summaries), and relays
back what the leader sends each node (Welcome, directives, refusals, acks). The leader admits what
a shard forwards exactly as if the agent had sent it; node ids come from the agent's Hello, which
the agent service checked against the agent's certificate before handing the stream here.

Liveness soft state kept here (last heard, stream open) is what an operator of the shard sees; the
verdicts stay on the leader. When the relay breaks (the leader died or stepped down) the shard
keeps the streams of agents that resync on a second Welcome (Hello.resyncs_on_welcome) and, once a
relay to the next leader is up, replays their Hellos to it ahead of anything else: the new leader
welcomes each through the same stream and the agent sends its resync reports, which rebuild the new
leader's soft state with no reconnect (at 12,500 nodes, no storm of TLS handshakes and Hellos
through backoff). Older agents' streams are ended, as are all of them when this replica is the one
that now leads (it holds its agents through the agent service, not a relay) or when no relay comes
up within KEEP_WITHOUT_LEADER_S: those agents reconnect. When the live replicas change, a node whose
shard is now another replica is told so (NotLeader with its shard) and its stream ended as a move,
which the leader does not take for a death signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from ftsup.common import logs
from ftsup.common.backoff import Backoff
from ftsup.common.deadline import within
from ftsup.common.shard_map import agent_holders, home_of, shard_of
from ftsup.common.tls import TlsFiles, channel_credentials, expect_supervisor
from ftsup.supervisor.agent_probe import VERDICT_WINDOW_S, AgentProbes
from ftsup.supervisor.core.token_bucket import TokenBucket
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.shard_queue import MAX_BATCH_ITEMS, HeardSince, UpQueue, forwarded
from ftsup.v1 import agent_pb2, shard_pb2, shard_pb2_grpc

log = logs.get("supervisor.shard")

RELAY_BACKOFF = Backoff(initial_s=0.05, max_s=0.5)  # a new leader is found within its failover grace
# The relay carries up to a whole shard's messages per batch: as large as the supervisor's server.
RELAY_OPTIONS = [("grpc.max_receive_message_length", 16 * 1024 * 1024),
                 ("grpc.max_send_message_length", 16 * 1024 * 1024)]
# Liveness summaries go at most this often (what is heard meanwhile gathers into the next): the
# leader's detector judges on its 0.1 s Tick, so this adds nothing to detection; a heartbeat's ack
# (asked only by the fleet bench) waits for it too.
SUMMARY_INTERVAL_S = 0.02
# A summary that owes no ack (every real agent's: they ask none) gathers for up to this long from
# its first heartbeat: each summary costs the leader a read, an input and an answer whatever it
# names, and a shard of 4,000 nodes at 1 s heartbeats sent 50 a second (issue 14, part 15: about
# half the leader's fixed CPU at 600 nodes, and the leader's intake grows with the shards, 25 at
# 100,000 nodes). A node's heard time at the leader is then up to this much later than the shard
# heard it, against a suspicion after 1.5 heartbeat intervals (1.5 s at the shortest).
SUMMARY_GATHER_S = 0.1
# With nothing heard for this long a summary goes anyway (empty), so that the leader can tell a
# quiet shard (a starved loop, a stopped process) from quiet nodes (core/policies/failure.py).
SHARD_KEEPALIVE_S = 0.2
# A relay that wakes for a lone message waits this long for others before it writes (Nagle's
# rule): the nodes of a shard report a step within milliseconds of each other, and a batch that
# holds many of their aggregates is one message, one run and one fold on the leader instead of
# one each (issue 14: at 1 s steps of 2,000 nodes the shards wrote ~900 batches a second of 1-2
# items). Heartbeats do not wait: they travel on the liveness stream.
UP_LINGER_S = 0.005
# While a step's burst keeps coming (the queue grew during the last linger, or fewer of the shard's
# nodes have reported the newest step than the step before it: UpQueue.steps, step_burst.py) and
# the queue holds only a step's messages (UpQueue.urgent), the batch is held open in such lingers
# up to this long, and what arrives while a batch is written is gathered the same way. A shard of
# 3,000-4,000 nodes reads a step's reports over a few hundred ms; one 5 ms linger gave the leader
# folds of 8-11 aggregates at 6,000 nodes, 50 ms with the growth rule alone 40-80, and its CPU per
# node-step falls steeply with a fold's size (`ftsup bench core-step --fold-sizes`, 12,500 nodes
# x 8 ranks: 64 us per node at 8 a fold, 26 at 50, 19 at 200, 17.5 at 4,096; part 16: the leader
# at 6,000 nodes went from ~0.12 to ~0.09-0.10 of a core from 50 ms to 200 ms). A step's decisions
# (vote, stragglers, checkpoint start, RAM snapshot commit) come up to this much later; a Hello, a
# stream's end or a fault report ends the wait at once.
UP_BURST_S = 0.2
# How often a relay looks whether etcd names another leader (a dict read; the watch keeps it fresh).
LEADER_WATCH_S = 0.1
# Agent streams are kept across a leader change for this long at most while no relay is up (an
# election takes a lease's TTL, a few seconds); past it they are ended and the agents redial.
KEEP_WITHOUT_LEADER_S = 30.0
# A kept stream's Hello is replayed only if its agent was heard within this many of its heartbeat
# intervals: a replayed Hello vouches for the agent, and one that went silent (a hung process whose
# connection lives on) must not be re-admitted, or un-quarantined, by the next leader on our word.
REPLAY_HEARD_WITHIN_INTERVALS = 2.0
# Agents' peer ports calibrated this often (agent_probe.CALIBRATE_PER_TICK each time), as the
# leader does for its own share on its Tick: ~160 connects a second while a fleet registers.
CALIBRATE_EVERY_S = 0.1
MESSAGES_PER_S = 2_000.0  # per agent stream, as the leader's own limit (agent_service.StreamLimits)
MESSAGE_BURST = 20_000.0


@dataclass(slots=True)
class ShardSession:
    """One agent stream held here."""

    session: int
    node_id: str
    incarnation: int
    outbox: StreamOutbox
    opened_s: float
    last_heard_s: float
    is_moved: bool = False  # ended here to move the node to another shard (not a death signal)
    messages: TokenBucket = field(default_factory=lambda: TokenBucket.full(MESSAGES_PER_S, MESSAGE_BURST, 0.0))
    hello: agent_pb2.AgentMessage | None = None  # replayed to a new leader, when the agent resyncs on a Welcome
    interval_s: float = 1.0  # the heartbeat interval its last Welcome set (the agent's default before one)
    peer: tuple[str, int] | None = None  # its agent's peer service (the Hello's), probed after a close
    calibrating: bool = False  # its peer port was queued for calibration (once a session: a kept
    # stream's second Welcome, from the next leader, names the same port)


class LinkShard:
    """The shard side of link shards, on every replica that follows (the leader holds its own share
    through the agent service directly)."""

    def __init__(self, address: str, live: Callable[[], Iterable[str]], *, tls_files: TlsFiles | None = None,
                 clock: Callable[[], float] = time.monotonic, up_capacity: int | None = None,
                 generation: Callable[[], int | None] = lambda: None,
                 leader: Callable[[], str] = lambda: "",
                 on_summary_admitted: Callable[[float], None] | None = None) -> None:
        self.address = address
        self._leader = leader  # the leader's advertised address ("" unknown): it holds no agents from 3 replicas
        self._generation = generation  # the generation in force (the follower's hot copy), for log lines
        self._live = live
        self._tls = tls_files
        self._clock = clock
        self._up = UpQueue(up_capacity) if up_capacity else UpQueue()
        self._up_ready = asyncio.Event()
        # (on_summary_admitted: the age of each admitted summary's oldest news, for the metrics)
        self._heard = HeardSince(clock=clock, on_admitted=on_summary_admitted)
        self._heard_ready = asyncio.Event()
        self._ack_asked = asyncio.Event()  # a heartbeat asking an ack was heard (its summary goes soon)
        self.summarises = False  # the leader takes liveness summaries (else heartbeats are forwarded)
        self.folds_holdings = False  # the leader takes SnapshotHoldings (else snapshot reports go one by one)
        self.packs_steps = False  # the leader takes ShardStepFolds (else each node's aggregate goes alone)
        self.packs_holdings = False  # the leader takes ShardHoldingsFolds (else each node's holdings go alone)
        # The leader takes agent_gone reports: this shard probes its own agents' peer ports
        # (supervisor/agent_probe.py) and the leader none of them (else the leader probes them).
        self.probes_agents = False
        self.offers_probes = True  # says so to the leader (False: as a shard before 2026-11-28, for tests)
        self.probes = AgentProbes(generation)
        self._sessions: dict[int, ShardSession] = {}
        self._node_session: dict[str, int] = {}
        self._ids = itertools.count(1)
        self.term = 0  # the leader's term while relaying; 0 while no relay is up
        self.leader_address = ""
        self.relay_up = asyncio.Event()
        self.has_relayed = False  # a relay came up once: this replica can hold its share (membership)
        self._kept_since: float | None = None  # streams kept across a leader change since then (no relay)
        self.kept_across_leaders = 0  # sessions replayed to a new leader instead of ended (a counter)

    # -- routing -----------------------------------------------------------------------------
    def home_of(self, node_id: str, unreachable: Iterable[str] = ()) -> str:
        """The replica that should hold `node_id`'s stream, as this replica sees the live set."""
        return home_of(node_id, self._live(), self.address, unreachable, self.leader_now())

    def leader_now(self) -> str:
        """The leader as this replica knows it: the follower's lookup, else (while relaying) the
        replica this shard relays to. An unknown leader counts as an agent holder (agent_holders),
        so a lookup that came back empty must not be all there is: a third of this shard's nodes
        would be moved to the leader, which sends them back here (a bench at 12,500 nodes lost
        241 nodes that way, dead after 10 s of bouncing)."""
        return self._leader() or (self.leader_address if self.relay_up.is_set() else "")

    def sessions(self) -> list[ShardSession]:
        return list(self._sessions.values())

    # -- agent streams (called by the agent service on a follower) ----------------------------
    async def serve(self, hello: agent_pb2.AgentMessage, requests: AsyncIterator[agent_pb2.AgentMessage],
                    peer: str) -> AsyncIterator[agent_pb2.SupervisorMessage]:
        """Holds one agent's stream: forwards its Hello and messages, yields what the leader sends it."""
        node_id, incarnation = hello.hello.node_id, hello.hello.incarnation
        if not self.relay_up.is_set():
            yield _retry_later("this replica holds no relay to a leader yet (a leader is being elected)")
            return
        now = self._clock()
        session = ShardSession(next(self._ids), node_id, incarnation, StreamOutbox(), now, now,
                               hello=hello if hello.hello.resyncs_on_welcome else None,
                               peer=(hello.hello.host, hello.hello.peer_port) if 0 < hello.hello.peer_port < 65536
                               else None)
        session.messages = TokenBucket.full(MESSAGES_PER_S, MESSAGE_BURST, now)
        replaced = self._node_session.get(node_id)
        self._sessions[session.session] = session
        self._node_session[node_id] = session.session
        if replaced is not None and replaced in self._sessions:
            self._sessions[replaced].outbox.close()  # the node reconnected here: its old stream is stale
        if not self._forward(session, hello):
            self._end(session)
            yield _retry_later("this shard's queue to the leader is full; retry")
            return
        log.info("node connected to shard", node_id=node_id, incarnation=incarnation, peer=peer,
                 session=session.session, leader=self.leader_address, generation=self._generation())
        reader = asyncio.create_task(self._read(session, requests))
        try:
            while True:
                message = await session.outbox.get()
                if message is None:
                    break
                yield message
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            self._end(session)
            log.info("node stream closed on shard", node_id=node_id, session=session.session, moved=session.is_moved,
                     generation=self._generation())

    async def _read(self, session: ShardSession, requests: AsyncIterator[agent_pb2.AgentMessage]) -> None:
        try:
            async for message in requests:
                now = self._clock()
                if session.outbox.is_closed:
                    return
                if not session.messages.take(now):
                    session.outbox.close(f"flooding: more than {MESSAGES_PER_S:g} messages/s after a burst of"
                                         f" {MESSAGE_BURST:g}; closing the stream")
                    return
                session.last_heard_s = now
                kind = message.WhichOneof("kind")
                if kind == "hello":
                    session.outbox.put(_refusal("a second Hello on one stream", "hello"))
                    continue
                if kind == "heartbeat" and self.summarises:
                    self._heard.note(session.session, message.heartbeat.seq if message.heartbeat.want_ack else 0)
                    self._heard_ready.set()
                    if message.heartbeat.want_ack:
                        self._ack_asked.set()
                    continue
                if not self._forward(session, message):
                    session.outbox.close("the shard's queue to the leader is full: reconnect")
                    return
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception as exc:  # undecodable bytes and the like end this stream only
            log.warning("agent stream read failed on shard", node_id=session.node_id, error=repr(exc),
                        generation=self._generation())
        finally:
            session.outbox.close()

    def _forward(self, session: ShardSession, message: agent_pb2.AgentMessage) -> bool:
        ok = self._up.push(forwarded(session.session, session.node_id, session.incarnation, message))
        self._up_ready.set()
        return ok

    def _end(self, session: ShardSession) -> None:
        """Forgets a session and tells the leader it ended (once)."""
        if self._sessions.pop(session.session, None) is None:
            return
        if self._node_session.get(session.node_id) == session.session:
            del self._node_session[session.node_id]
        if self.relay_up.is_set():
            # A full queue cannot take the end either: the relay is then ended (the leader drops
            # every route of this shard), which is the same news for this node.
            if not self._up.push(forwarded(session.session, session.node_id, session.incarnation,
                                           moved=session.is_moved)):
                self._up.clear()
                self.relay_up.clear()
            self._up_ready.set()
            if self.probes_agents and not session.is_moved and session.calibrating and session.peer is not None:
                self._probe_after_close(session, session.peer)  # (a welcomed session's: queued for calibration)

    def _probe_after_close(self, session: ShardSession, peer: tuple[str, int]) -> None:
        """Probes a closed session's agent (if this shard calibrated it) and tells the leader when it
        is gone, within the same relay: a report for an older relay's session would name nothing."""
        term = self.term

        def gone(detail: str) -> None:
            if self.relay_up.is_set() and self.term == term:
                if self._up.push(forwarded(session.session, session.node_id, session.incarnation, gone=detail)):
                    self._up_ready.set()

        self.probes.after_close(session.node_id, peer, VERDICT_WINDOW_S, gone)

    def _peer_while_open(self, node_id: str) -> tuple[str, int] | None:
        """A node's agent's peer address while its stream is open here (calibration's)."""
        number = self._node_session.get(node_id)
        session = self._sessions.get(number) if number is not None else None
        if session is None or session.outbox.is_closed:
            return None
        return session.peer

    def rehome(self) -> int:
        """Moves the nodes whose shard is now another replica (the live set changed): each is told
        its shard and its stream ends as a move. Returns how many moved.

        Not while no relay is up: the streams kept for the next leader stay where they are until
        it is known (a home worked out meanwhile would count the coming leader as a shard and move
        nodes to it, and back once it leads); the next change, or the periodic pass, moves them."""
        if not self.relay_up.is_set():
            return 0
        moved = 0
        for session in list(self._sessions.values()):
            home = self.home_of(session.node_id)
            if home != self.address and not session.outbox.is_closed:
                session.is_moved = True
                session.outbox.put(agent_pb2.SupervisorMessage(
                    not_leader=agent_pb2.NotLeader(leader_address=home, shard_address=home)))
                session.outbox.close()
                moved += 1
        if moved:
            log.info("nodes moved to their new shards", moved=moved)
        return moved

    def shutdown(self) -> int:
        """A clean stop (SIGTERM, a rolling restart): every node held here is told its next shard and
        its stream ends as a move, so the leader takes none of it for a death. Returns how many."""
        others = agent_holders([replica for replica in self._live() if replica != self.address], self.leader_now())
        for session in list(self._sessions.values()):
            session.is_moved = True
            home = shard_of(session.node_id, others) if others else ""
            session.outbox.put(agent_pb2.SupervisorMessage(
                not_leader=agent_pb2.NotLeader(leader_address=home, shard_address=home)))
            session.outbox.close()
        if self._sessions:
            log.info("shard stopping: its nodes move to their next shards", nodes=len(self._sessions))
        return len(self._sessions)

    def drop_all(self, why: str) -> None:
        """Ends every agent stream held here (the relay is gone): the agents reconnect."""
        if self._sessions:
            log.warning("ending every agent stream held by this shard", streams=len(self._sessions), why=why)
        for session in list(self._sessions.values()):
            session.outbox.close()
        self._sessions.clear()
        self._node_session.clear()
        self._up.clear()
        self._heard.clear()
        self._kept_since = None

    def keep_for_the_next_leader(self, why: str) -> int:
        """The relay is gone: ends the streams of agents that cannot resync on a second Welcome and
        keeps the others for the next leader (`_replay_hellos`). What the kept agents sent that was
        queued for the old leader and not yet taken stays queued, behind their replayed Hellos
        (a step report or an Xid queued at a failover was dropped before); what was taken and in
        transit is lost with the relay. Returns how many streams are kept."""
        ended = [session for session in self._sessions.values() if session.hello is None]
        for session in ended:
            self._forget(session)
        self._up.keep_sessions(set(self._sessions))
        self._heard.clear()
        if self._sessions and self._kept_since is None:
            self._kept_since = self._clock()
        if self._sessions or ended:
            log.warning("relay to the leader lost: keeping agent streams for the next leader",
                        kept=len(self._sessions), ended=len(ended), why=why)
        return len(self._sessions)

    def _forget(self, session: ShardSession) -> None:
        """Ends `session`'s stream and forgets it here without telling any leader (none relays it)."""
        session.outbox.close()
        del self._sessions[session.session]
        if self._node_session.get(session.node_id) == session.session:
            del self._node_session[session.node_id]

    def _drop_kept_unless_relayable(self, leader: str) -> None:
        """Ends the kept streams once they cannot be relayed: this replica is named the leader (its
        agents come through the agent service; a replica that wins stops this loop, whose end
        drops them too), or no relay came up within KEEP_WITHOUT_LEADER_S."""
        if self._kept_since is None or self.relay_up.is_set():
            return
        if leader == self.address:
            self.drop_all("this replica leads now: its agents reconnect to it directly")
        elif self._clock() - self._kept_since > KEEP_WITHOUT_LEADER_S:
            self.drop_all(f"no relay to a leader for {KEEP_WITHOUT_LEADER_S:g}s")

    def _replay_hellos(self) -> int:
        """Puts every kept session's Hello ahead of what its agent sent since (one loop turn: no
        message of a session can reach the new leader before its Hello). Returns how many."""
        self._kept_since = None
        now = self._clock()
        kept, silent = [], []
        for session in self._sessions.values():
            if session.hello is None or session.outbox.is_closed:
                continue
            if now - session.last_heard_s <= REPLAY_HEARD_WITHIN_INTERVALS * session.interval_s:
                kept.append(forwarded(session.session, session.node_id, session.incarnation, session.hello))
            else:
                silent.append(session)
        for session in silent:  # (forgotten before the relay is up: the new leader never hears of them)
            self._forget(session)
        if silent:
            log.warning("not vouching for silent agents to the new leader: their streams end",
                        nodes=len(silent), example=silent[0].node_id)
        if not kept:
            return 0
        self._up.put_first(kept)
        self._up_ready.set()
        self.kept_across_leaders += len(kept)
        log.info("replaying kept agents' Hellos to the new leader", sessions=len(kept), leader=self.leader_address,
                 term=self.term)
        return len(kept)

    # -- the relay to the leader ----------------------------------------------------------------
    async def relay_forever(self, leader_address: Callable[[], str], rng: random.Random | None = None) -> None:
        """Keeps a relay to whoever leads (per `leader_address`) until cancelled."""
        rng = rng or random.Random()
        attempt = 0
        try:
            while True:
                address = leader_address()
                self._drop_kept_unless_relayable(address)
                if address and address != self.address:
                    try:
                        await self._relay(address, leader_address)
                    except (grpc.aio.AioRpcError, ConnectionError) as exc:
                        log.info("relay to the leader ended", leader=address, error=_describe(exc))
                    except Exception:
                        log.exception("relay to the leader failed", leader=address)
                    attempt = 0 if self.term else attempt + 1
                    self._lost()
                else:
                    attempt += 1
                await asyncio.sleep(RELAY_BACKOFF.delay_s(attempt, rng))
        finally:
            self._lost()
            self.probes.cancel()
            if self._sessions:
                self.drop_all("this replica stops relaying")

    def _lost(self) -> None:
        was_up = self.relay_up.is_set()
        self.relay_up.clear()
        self.term = 0
        if was_up:
            self.keep_for_the_next_leader("the relay to the leader ended")

    async def _relay(self, address: str, leader_address: Callable[[], str] = lambda: "") -> None:
        channel = (grpc.aio.secure_channel(address, channel_credentials(self._tls),
                                           options=[*RELAY_OPTIONS, *expect_supervisor()])
                   if self._tls is not None else grpc.aio.insecure_channel(address, options=RELAY_OPTIONS))
        try:
            stub: Any = shard_pb2_grpc.LinkShardStub(channel)  # (the stubs' types miss the streaming form)
            call = stub.Relay()
            await call.write(shard_pb2.ShardBatch(replica=self.address, keeps_alive=True,
                                                  probes_agents=self.offers_probes, takes_shared=True))
            first = await call.read()
            if not isinstance(first, shard_pb2.LeaderBatch):  # EOF: the leader said nothing
                return
            self.term, self.leader_address = first.term, address
            self.summarises = first.takes_liveness_summaries
            self.folds_holdings = first.takes_snapshot_holdings
            self.packs_steps = first.takes_step_folds
            self.packs_holdings = first.takes_holdings_folds
            self.probes_agents = first.takes_agent_gone and self.offers_probes
            self._heard.clear()
            self._replay_hellos()  # (only kept sessions' messages can be queued: none opens without a relay)
            self.relay_up.set()
            self.has_relayed = True
            log.info("relaying to the leader", leader=address, term=self.term)
            tasks = [asyncio.create_task(self._read_leader(call)), asyncio.create_task(self._write(call)),
                     asyncio.create_task(_until_another_leads(address, leader_address))]
            if self.summarises:
                tasks.append(asyncio.create_task(self._summarise(stub)))
            if self.probes_agents:
                tasks.append(asyncio.create_task(self._calibrate()))
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # (raises what ended it; a clean end ends the relay too)
            finally:
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.gather(*tasks, return_exceptions=True)
                call.cancel()
        finally:
            await channel.close(None)

    async def _calibrate(self) -> None:
        """Calibrates the welcomed agents' peer ports, a few each CALIBRATE_EVERY_S (agent_probe)."""
        while True:
            self.probes.calibrate(self._peer_while_open)
            await asyncio.sleep(CALIBRATE_EVERY_S)

    async def _read_leader(self, call: Any) -> None:
        """Delivers what the leader sends its nodes; returns at the stream's end or another term."""
        while True:
            batch = await call.read()
            if not isinstance(batch, shard_pb2.LeaderBatch):  # EOF
                return
            if batch.term and batch.term != self.term:
                return  # another leader: start over with it
            self._deliver(batch)

    async def _write(self, call: Any) -> None:
        while True:
            while len(self._up):
                await call.write(shard_pb2.ShardBatch(items=self._up.take(
                    MAX_BATCH_ITEMS, folds_holdings=self.folds_holdings, packs_steps=self.packs_steps,
                    packs_holdings=self.packs_holdings)))
                if len(self._up) and not self._up.urgent:
                    await self._linger()  # (what came during the write: a step's burst goes on, gather it)
            if not self.relay_up.is_set():
                await call.done_writing()
                return
            self._up_ready.clear()
            await self._up_ready.wait()
            await self._linger()

    async def _linger(self) -> None:
        """Holds the next batch open for the rest of a burst: one UP_LINGER_S, then more of them
        while a step's burst keeps arriving (`keeps_lingering`), until a batch is full."""
        clock = asyncio.get_running_loop().time
        started = clock()
        while len(self._up) < MAX_BATCH_ITEMS:
            before = len(self._up)
            await asyncio.sleep(UP_LINGER_S)
            if not keeps_lingering(before, len(self._up), clock() - started, self._up.urgent,
                                   self._up.steps.incomplete):
                return

    async def _summarise(self, stub: Any) -> None:
        """The liveness stream: every SUMMARY_INTERVAL_S at most, the sessions heard since the last
        summary, gathered for up to SUMMARY_GATHER_S unless one asked an ack; a heartbeat that
        asked for an ack is answered once the leader admitted it. Its own stream, so a relay held
        back by the leader's flow control does not hold it back."""
        call = stub.Liveness()
        await call.write(shard_pb2.ShardLiveness(replica=self.address))
        reader = asyncio.create_task(self._read_admitted(call))
        try:
            while not reader.done():
                if not self._heard:
                    self._heard_ready.clear()
                    with contextlib.suppress(TimeoutError):
                        await within(_first_of(self._heard_ready.wait(), reader), SHARD_KEEPALIVE_S)
                    if not self._heard and not reader.done():
                        await call.write(shard_pb2.ShardLiveness())  # (alive, nothing heard)
                    continue
                if not self._heard.asks_acks:  # (liveness alone: gather more, unless an ack is asked meanwhile)
                    self._ack_asked.clear()
                    with contextlib.suppress(TimeoutError):
                        await within(_first_of(self._ack_asked.wait(), reader), SUMMARY_GATHER_S)
                heard, summary = self._heard.take()
                await call.write(shard_pb2.ShardLiveness(summary=summary, heard=heard))
                await _first_of(asyncio.sleep(SUMMARY_INTERVAL_S), reader)  # (let the next gather)
            reader.result()
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            call.cancel()

    async def _read_admitted(self, call: Any) -> None:
        while True:
            admitted = await call.read()
            if not isinstance(admitted, shard_pb2.LivenessAdmitted):  # EOF: the leader ended it
                return
            for session_id, seq in self._heard.admitted(admitted.summary):
                acked = self._sessions.get(session_id)
                if acked is not None:
                    acked.outbox.put(agent_pb2.SupervisorMessage(heartbeat_ack=agent_pb2.HeartbeatAck(seq=seq)))

    def _deliver(self, batch: shard_pb2.LeaderBatch) -> None:
        for item in batch.items:
            if item.sessions:  # one message for each of these sessions (a commit's SnapshotRetain)
                if item.HasField("message") and not item.close:
                    for session_id in item.sessions:
                        self._deliver_one(session_id, item)
                continue
            self._deliver_one(item.session, item)

    def _deliver_one(self, session_id: int, item: shard_pb2.Addressed) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            return  # ended here meanwhile: the leader learns it from our end item
        if item.HasField("message"):
            if item.message.WhichOneof("kind") == "welcome":
                session.last_heard_s = self._clock()
                if self.probes_agents and session.peer is not None and not session.calibrating:
                    session.calibrating = True
                    self.probes.admitted(session.node_id)  # (calibrated again: its port may be new)
                interval_s = item.message.welcome.heartbeat_interval_s
                if math.isfinite(interval_s) and interval_s > 0:
                    session.interval_s = interval_s
            session.outbox.put(item.message)
        if item.close:
            session.outbox.close()


def keeps_lingering(queued_before: int, queued_now: int, waited_s: float, urgent: bool,
                    step_incomplete: bool = False) -> bool:
    """Whether a relay that has lingered `waited_s` holds its batch open for another UP_LINGER_S:
    only while a step's burst is still arriving (the queue grew during the last linger, or the
    newest step has fewer reporters than the one before it: `step_incomplete`), nothing queued is
    urgent, and UP_BURST_S is not spent."""
    return ((queued_now > queued_before or step_incomplete) and not urgent
            and waited_s + UP_LINGER_S <= UP_BURST_S + 1e-9)


async def _first_of(awaitable: Awaitable[object], task: asyncio.Task[None]) -> None:
    """Waits for `awaitable` or for `task` to end, whichever comes first."""
    waiter = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


def _refusal(reason: str, refused: str) -> agent_pb2.SupervisorMessage:
    return agent_pb2.SupervisorMessage(refusal=agent_pb2.Refusal(
        reason=reason, refused=refused, kind=agent_pb2.REFUSAL_KIND_PERMANENT))


def _retry_later(reason: str) -> agent_pb2.SupervisorMessage:
    return agent_pb2.SupervisorMessage(refusal=agent_pb2.Refusal(
        reason=reason, refused="hello", kind=agent_pb2.REFUSAL_KIND_RETRYABLE, ends_stream=True))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return repr(exc)


async def _until_another_leads(address: str, leader_address: Callable[[], str]) -> None:
    """Returns once etcd names a leader other than `address`. A leader that stopped or lost its host
    or network sends no reset: its relay would wait on TCP's retransmissions (minutes) while its
    successor, elected once the lease expired, hears nothing from this shard's nodes and, after its
    failover grace, judges them dead. The election is the signal: the relay moves on at once."""
    while True:
        leader = leader_address()
        if leader and leader != address:
            log.info("another replica leads: ending the relay to the old leader", old=address, new=leader)
            return
        await asyncio.sleep(LEADER_WATCH_S)
