"""The agent's one bidirectional stream to the supervisor.

Owns: Hello (with the per-process incarnation), heartbeats, relaying queued reports, handing
Directives to the launcher, following NotLeader redirects, and reconnecting with jittered backoff
across the configured addresses while trainers keep running. With replicated supervisors every
replica holds a link shard (a share of the agents, by rendezvous hashing of node ids): the agent
dials the replicas in its node's rendezvous order (its own shard first, then where it moves when
that one dies), follows a NotLeader's `shard_address`, and names in its Hello the replicas it
could not reach, so a dead shard's nodes re-home at their first reconnect. Under mTLS the handshake accepts only
a supervisor's certificate (common/tls.expect_supervisor): a node's certificate cannot pass for one.

Refusals are typed (Refusal.kind): a RETRYABLE one ("not decided now": the supervisor's log is
unavailable, leadership is changing) is retried with the same backoff while trainers go on; only
a PERMANENT refusal of the Hello is fatal (`HelloRefused`): this node may not join (e.g. a
duplicate or unknown node id, a certificate naming another node), and retrying cannot fix it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Awaitable, Callable

import grpc
import structlog

from ftsup.agent.config import MAX_HEARTBEAT_INTERVAL_S, AgentConfig
from ftsup.agent.core.outbox import Outbox, Priority
from ftsup.agent.grpc_options import MESSAGE_OPTIONS
from ftsup.common import holdings_pack, step_pack
from ftsup.common.backoff import Backoff
from ftsup.common.deadline import within
from ftsup.common.shard_map import ranked
from ftsup.common.tls import channel_credentials, expect_supervisor
from ftsup.v1 import agent_pb2, agent_pb2_grpc

Logger = structlog.typing.FilteringBoundLogger
StreamCall = grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.SupervisorMessage]  # Supervisor.Connect

AGENT_VERSION = "0.1.0"
RECONNECT_BACKOFF = Backoff(initial_s=0.05, max_s=1.0)  # the new leader's grace assumes <= 1 s
OUTBOX_CAPACITY = 10_000
# Each session's channel connects afresh: gRPC otherwise shares a subchannel per address across
# channels, with the connect backoff it learned while that replica was down, so a replica that
# just came back would still be refused for seconds ("failed to connect to all addresses").
SESSION_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]
# A supervisor that stops answering without closing the connection (a stopped process, a host that
# lost power or its network: no reset ever comes) is noticed by HTTP/2 pings, which gRPC's core
# answers and times out off the event loop: one every heartbeat interval (at least
# MIN_KEEPALIVE_S), dead after the same again unanswered. The agent then moves to its next
# replica within about two intervals, inside the time the leader holds a quiet shard's nodes
# (core/policies/failure.py: SHARD_QUIET_LIMIT x dead_after). The server permits pings this often
# (supervisor/server/server_limits.py: MIN_PING_INTERVAL_MS).
MIN_KEEPALIVE_S = 1.0
# A replica that accepts the connection but never completes the HTTP/2 handshake (the same stopped
# process, dialled again) is given up after this; gRPC's own connect timeout is 20 s. The first
# dial after a working session was lost to an error gRPC did not word as a ping timeout (a reset,
# or a grpcio that words it otherwise) allows one heartbeat interval (at least MIN_KEEPALIVE_S):
# a live replica completes it in milliseconds, a silent one is then left within three intervals.
CONNECT_LIMIT_S = 5.0
MAX_UNREACHABLE = 16  # replicas named in a Hello as unreachable, at most (a fleet runs 3-7 replicas)


def keepalive_options(interval_s: float) -> list[tuple[str, int]]:
    """Channel options that end a session whose supervisor stopped answering pings: one ping
    every `interval_s` (at least MIN_KEEPALIVE_S), the session lost when one goes unanswered as long."""
    keepalive_ms = int(max(MIN_KEEPALIVE_S, interval_s) * 1000)
    return [
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", keepalive_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # the supervisor sends no data for long stretches
        ("grpc.http2.ping_timeout_ms", keepalive_ms),
    ]


class HelloRefused(Exception):
    """The supervisor refused this node's Hello for good (a PERMANENT refusal); the message is its reason."""


class _RetryLater(Exception):
    """The supervisor refused for now (a RETRYABLE refusal that ends the stream): reconnect later."""


class _Unresponsive(Exception):
    """The supervisor took the connection but did not complete the HTTP/2 handshake in time."""


class _Redirect(Exception):
    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.address = address


def new_incarnation(rng: random.Random) -> int:
    """A random 63-bit id, drawn once per agent process start (reconnects keep it)."""
    return rng.getrandbits(63)


def _priority(message: agent_pb2.AgentMessage) -> Priority:
    kind = message.WhichOneof("kind")
    if kind == "step_report":
        return Priority.STEP
    if kind in ("trainer_exit", "rank_finished", "checkpoint_shard", "sdc_check_result"):
        return Priority.ESSENTIAL
    return Priority.REPORT


MAX_STICKY = 4096  # facts kept for re-sending; far above ranks per node x checkpoints in flight
# A node's first step report of a step waits this long for its other ranks' reports, which then
# go as one StepAggregate (issue 14: one message per node per step for the leader, not one per
# rank). The ranks leave the same all-reduce within a millisecond or two; a rank that does not
# report (dead, or slower) costs its node's report this much latency, nothing else.
FOLD_WINDOW_S = 0.02
MAX_FOLD = 1024  # step reports in one aggregate; far above the ranks of a node
# A step's first snapshot report waits this long for the node's other holdings of that step, which
# then go as one SnapshotHoldings (issue 14: one message per node per step, not one per rank and
# holder). A node's own ranks hand their snapshots over as each lands (they finish the same step
# together, but the copies out of the trainers take as long as their sizes); the buddy copies
# arrive together as the peer's streams end, usually seconds later: at most a node's own and its
# buddy's ranks make two messages. Holdings go at once when the node's rank count is queued or
# anything but step reports (which go by them) queues behind them: nothing waits longer than this
# window, nothing but holdings waits on them, and a commit (which needs the step's vote anyway)
# comes at most this much later.
HOLDINGS_WINDOW_S = 0.05


class Reports:
    """The outgoing report queue: anyone may `send`; the link drains it while connected.

    A write that succeeded only means the bytes left: a supervisor that dies before handling them
    (a leader SIGKILLed mid-failover) loses them, and its successor rebuilds soft state from what
    agents send. Facts that happen once and that the job cannot finish without (a rank finished,
    a checkpoint shard written) are therefore kept as `sticky` and sent again at the start of
    every new session; the supervisor treats a repeat as a no-op.
    """

    def __init__(self, capacity: int = OUTBOX_CAPACITY, clock: Callable[[], float] = time.monotonic) -> None:
        self._outbox: Outbox[agent_pb2.AgentMessage] = Outbox(capacity)
        self._ready = asyncio.Event()
        self._sticky: dict[tuple[str, int, int, str], agent_pb2.AgentMessage] = {}
        self._clock = clock
        self._step_seen: dict[tuple[int, int], float] = {}  # (generation, step) -> its first report's arrival
        self._held_seen: dict[tuple[int, int], float] = {}  # (generation, step) -> its first holding's arrival

    def send(self, message: agent_pb2.AgentMessage, *, sticky: bool = False) -> None:
        if message.WhichOneof("kind") == "step_report":
            step_key = (message.step_report.generation, message.step_report.step)
            if step_key not in self._step_seen:
                if len(self._step_seen) >= MAX_FOLD:  # only reports dropped unsent leave keys behind
                    del self._step_seen[next(iter(self._step_seen))]
                self._step_seen[step_key] = self._clock()
        elif message.WhichOneof("kind") == "snapshot_report":
            held = holdings_pack.key(message.snapshot_report)
            if held not in self._held_seen:
                if len(self._held_seen) >= MAX_FOLD:  # only reports dropped unsent leave keys behind
                    del self._held_seen[next(iter(self._held_seen))]
                self._held_seen[held] = self._clock()
        self._outbox.push(message, _priority(message))
        self._ready.set()
        if sticky:
            key = _sticky_key(message)
            self._sticky.pop(key, None)
            self._sticky[key] = message
            while len(self._sticky) > MAX_STICKY:
                del self._sticky[next(iter(self._sticky))]

    def sticky(self) -> list[agent_pb2.AgentMessage]:
        """The facts to send again to a supervisor this agent just (re)connected to, oldest first."""
        return list(self._sticky.values())

    def forget_sticky_before(self, generation: int) -> None:
        """Facts about generations before `generation` can no longer matter."""
        for key in [k for k in self._sticky if k[1] < generation]:
            del self._sticky[key]

    def __len__(self) -> int:
        return len(self._outbox)

    @property
    def dropped(self) -> int:
        return self._outbox.dropped

    def peek(self) -> agent_pb2.AgentMessage | None:
        return self._outbox.peek()

    def pop(self) -> agent_pb2.AgentMessage:
        message = self._outbox.pop()
        if not len(self._outbox):
            self._ready.clear()
        return message

    def take(self, expected_ranks: int, expected_holdings: int = 0
             ) -> tuple[agent_pb2.AgentMessage | None, list[agent_pb2.AgentMessage], float]:
        """What to write next and the queued items it stands for (`done(items)` once written).

        The head's step reports of one step go as one StepAggregate: the node's ranks' reports of
        that step queued before anything but snapshot reports (which the aggregate may overtake:
        a step's report precedes its snapshot's anyway). While fewer than `expected_ranks` are
        queued and the first came less than FOLD_WINDOW_S ago: (None, [], seconds to wait for the
        rest). (None, [], 0.0): nothing queued. `expected_ranks` 0: no folding (a supervisor that
        did not say it takes aggregates). Snapshot reports fold likewise into one SnapshotHoldings
        (`_take_holdings`) when `expected_holdings` (the ranks a node's holdings usually count) is
        at least 1."""
        head = self._outbox.peek()
        if head is None:
            return None, [], 0.0
        holdings_wait_s = 0.0
        if head.WhichOneof("kind") == "snapshot_report" and expected_holdings >= 1:
            held, items, holdings_wait_s = self._take_holdings(head, expected_holdings)
            if held is not None:
                return held, items, 0.0
            # The holdings wait for more: step reports behind them may go meanwhile (they
            # overtake snapshot reports anyway, see below).
            head = next((m for m in self._outbox.head(MAX_FOLD) if m.WhichOneof("kind") == "step_report"), None)
            if head is None:
                return None, [], holdings_wait_s
        if head.WhichOneof("kind") != "step_report" or expected_ranks < 1:
            return head, [head], 0.0
        key = (head.step_report.generation, head.step_report.step)
        run: list[agent_pb2.AgentMessage] = []
        ranks: set[int] = set()
        for message in self._outbox.head(MAX_FOLD):
            kind = message.WhichOneof("kind")
            if kind == "snapshot_report":
                continue
            report = message.step_report
            if kind != "step_report" or (report.generation, report.step) != key or report.rank in ranks:
                break
            run.append(message)
            ranks.add(report.rank)
        waited_s = self._clock() - self._step_seen.get(key, -math.inf)
        if len(run) < expected_ranks and waited_s < FOLD_WINDOW_S:
            return None, [], min(FOLD_WINDOW_S - waited_s, holdings_wait_s or math.inf)
        self._step_seen.pop(key, None)
        if len(run) == 1:
            return head, run, 0.0
        aggregate = step_pack.pack([m.step_report for m in run])
        return agent_pb2.AgentMessage(step_aggregate=aggregate), run, 0.0

    def _take_holdings(self, head: agent_pb2.AgentMessage, expected: int
                       ) -> tuple[agent_pb2.AgentMessage | None, list[agent_pb2.AgentMessage], float]:
        """The head's step's queued snapshot reports (each rank once) as one SnapshotHoldings, once
        `expected` of them are queued, HOLDINGS_WINDOW_S after the first came, or at once when a
        message of another kind than step reports waits behind them (a step report waits for
        nothing either: `take` lets step reports go by waiting holdings). They may overtake other
        steps' holdings and step reports; nothing else."""
        key = holdings_pack.key(head.snapshot_report)
        run: list[agent_pb2.AgentMessage] = []
        ranks: set[int] = set()
        is_blocking = False
        for message in self._outbox.head(MAX_FOLD):
            kind = message.WhichOneof("kind")
            if kind == "step_report":
                continue  # it may go by (`take`), and a step's report precedes its snapshot's anyway
            if kind != "snapshot_report":
                is_blocking = True
                break
            report = message.snapshot_report
            if holdings_pack.key(report) == key and report.rank not in ranks:
                run.append(message)
                ranks.add(report.rank)
        waited_s = self._clock() - self._held_seen.get(key, -math.inf)
        if len(run) < expected and waited_s < HOLDINGS_WINDOW_S and not is_blocking:
            return None, [], HOLDINGS_WINDOW_S - waited_s
        self._held_seen.pop(key, None)
        if len(run) == 1:
            return head, run, 0.0
        holdings = holdings_pack.pack([m.snapshot_report for m in run])
        return agent_pb2.AgentMessage(snapshot_holdings=holdings), run, 0.0

    def done(self, items: list[agent_pb2.AgentMessage]) -> None:
        """`take`'s items were written: out of the queue."""
        self._outbox.remove(items)
        if not len(self._outbox):
            self._ready.clear()

    async def wait(self, timeout_s: float) -> None:
        """Until a report is queued, `wake` is called, or `timeout_s` passes."""
        try:
            await within(self._ready.wait(), timeout_s)
        except TimeoutError:
            pass
        if not len(self._outbox):  # (a wake with nothing queued is spent)
            self._ready.clear()

    def wake(self) -> None:
        """Ends a `wait` now (the writer has something other than a report to send)."""
        self._ready.set()


def fold_holdings(messages: list[agent_pb2.AgentMessage]) -> list[agent_pb2.AgentMessage]:
    """`messages` with the SnapshotReports of each generation's step packed into one
    SnapshotHoldings at the place of the first (each rank once; a lone report stays as it is);
    every other message keeps its place."""
    groups: dict[tuple[int, int], list[int]] = {}
    ranks: dict[tuple[int, int], set[int]] = {}
    for position, message in enumerate(messages):
        if message.WhichOneof("kind") == "snapshot_report":
            key = holdings_pack.key(message.snapshot_report)
            if message.snapshot_report.rank not in ranks.setdefault(key, set()):
                ranks[key].add(message.snapshot_report.rank)
                groups.setdefault(key, []).append(position)
    out: dict[int, agent_pb2.AgentMessage | None] = dict(enumerate(messages))
    for positions in groups.values():
        if len(positions) > 1:
            packed = holdings_pack.pack([messages[p].snapshot_report for p in positions])
            out[positions[0]] = agent_pb2.AgentMessage(snapshot_holdings=packed)
            for position in positions[1:]:
                out[position] = None
    return [message for message in out.values() if message is not None]


def _sticky_key(message: agent_pb2.AgentMessage) -> tuple[str, int, int, str]:
    kind = message.WhichOneof("kind") or ""
    body = getattr(message, kind)
    return (kind, int(getattr(body, "generation", 0)), int(getattr(body, "rank", 0)),
            str(getattr(body, "checkpoint_id", "")))


class SupervisorLink:
    def __init__(
        self,
        config: AgentConfig,
        *,
        incarnation: int,
        peer_port: int,
        reports: Reports,
        on_directive: Callable[[agent_pb2.Directive], Awaitable[None] | None],
        running_generation: Callable[[], int],
        log: Logger,
        local_ranks: Callable[[], int] = lambda: 1,
        rng: random.Random,
        backoff: Backoff = RECONNECT_BACKOFF,
        resync: Callable[[], list[agent_pb2.AgentMessage]] = list,
    ) -> None:
        self._resync = resync  # state reports (e.g. snapshots held) a new session starts with
        self._config = config
        self._incarnation = incarnation
        self._peer_port = peer_port
        self._reports = reports
        self._on_directive = on_directive
        self._directive: agent_pb2.Directive | None = None  # the last one handed on (a SnapshotRetain moves it)
        self._running_generation = running_generation
        self._local_ranks = local_ranks  # ranks this node runs now: how many step reports make a step
        self._log = log
        self._rng = rng
        self._backoff = backoff
        self._index = 0
        self._redirect: str | None = None
        # The node's rendezvous order over the configured replicas: its link shard first.
        self._addresses = ranked(config.node_id, config.supervisors) if len(config.supervisors) > 1 \
            else list(config.supervisors)
        self._unreachable: list[str] = []  # replicas that did not answer since the last Welcome
        self._interval_s = config.heartbeat_interval_s  # the last Welcome's, else the configured one
        self._redial_quickly = False  # the next dial follows a working session lost (see CONNECT_LIMIT_S)

    def _hello(self) -> agent_pb2.AgentMessage:
        c = self._config
        return agent_pb2.AgentMessage(
            hello=agent_pb2.Hello(
                node_id=c.node_id,
                incarnation=self._incarnation,
                role=c.role_proto,
                host=c.host,
                peer_port=self._peer_port,
                gpus=c.gpus,
                agent_version=AGENT_VERSION,
                failure_domain=c.failure_domain,
                unreachable_replicas=self._unreachable,
                resyncs_on_welcome=True,
                takes_snapshot_retain=True,
            )
        )

    def _retained(self, notice: agent_pb2.SnapshotRetain) -> agent_pb2.Directive | None:
        """The directive in force with the notice's retain floor (a RAM snapshot step committed),
        handed on as the whole directive the supervisor no longer sends for it; None when the
        notice is of another generation than that directive or moves nothing."""
        current = self._directive
        if current is None or current.generation != notice.generation:
            return None
        if current.retain_from_step == notice.retain_from_step:
            return None
        moved = agent_pb2.Directive()
        moved.CopyFrom(current)
        moved.retain_from_step = notice.retain_from_step
        self._directive = moved
        return moved

    def _next_address(self) -> str:
        if self._redirect:
            address, self._redirect = self._redirect, None
            return address
        # Replicas that did not answer since the last Welcome are skipped while another is left:
        # dialling a stopped one again costs CONNECT_LIMIT_S.
        candidates = [a for a in self._addresses if a not in self._unreachable] or self._addresses
        address = candidates[self._index % len(candidates)]
        self._index += 1
        return address

    def _mark_unreachable(self, address: str) -> None:
        if address not in self._unreachable:
            self._unreachable = [*self._unreachable, address][-MAX_UNREACHABLE:]

    async def run(self) -> None:
        """Keeps a stream open until cancelled; raises HelloRefused when this node may not join."""
        attempt = 0
        while True:
            address = self._next_address()
            log = self._log.bind(supervisor=address)
            state = _SessionState()
            try:
                await self._session(address, state, log)
                log.warning("stream_closed_by_supervisor")
            except _Redirect as redirect:
                log.info("redirected", to=redirect.address or None)
                self._redirect = redirect.address or None
                state.welcomed = True  # a supervisor answered: retry from the first backoff step
            except HelloRefused:
                raise
            except _RetryLater as exc:
                # Not a verdict on this node: keep the trainers, try again after the backoff.
                log.warning("hello_deferred", reason=str(exc), retry=True)
            except _Unresponsive as exc:
                self._mark_unreachable(address)
                log.warning("supervisor_unresponsive", reason=str(exc))
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    # mTLS: our certificate does not name our node id; no retry can fix that.
                    raise HelloRefused(exc.details() or "permission denied") from exc
                if exc.code() == grpc.StatusCode.UNAVAILABLE and (not state.welcomed or _is_silent_loss(exc)):
                    # Refused, or a working session whose pings went unanswered: the next Hello
                    # names this replica, so the next one holds this node meanwhile.
                    self._mark_unreachable(address)
                elif exc.code() == grpc.StatusCode.UNAVAILABLE:
                    # A working session reset (a network blip, a restart): this node's own shard
                    # is dialled again first, refused at once if it is gone, no move if it is
                    # not, and given one interval to answer if it went silent.
                    self._redial_quickly = True
                log.warning("stream_error", code=exc.code().name, details=exc.details())
            except Exception as exc:
                log.warning("stream_error", error=repr(exc))
            # Back off from the start after a stream that worked; grow it while nothing answers.
            attempt = 0 if state.welcomed else attempt + 1
            if state.is_session:
                self._index = 0  # a stream that worked ended: start again from this node's own shard
            delay_s = self._backoff.delay_s(attempt, self._rng)
            await asyncio.sleep(delay_s)

    async def _session(self, address: str, state: _SessionState, log: Logger) -> None:
        files = self._config.tls_files
        # Credentials are re-read per session, so renewed certificates apply at the next reconnect.
        options = [*MESSAGE_OPTIONS, *SESSION_OPTIONS, *keepalive_options(self._interval_s)]
        channel = (grpc.aio.secure_channel(address, channel_credentials(files), options=[*options, *expect_supervisor()])
                   if files is not None else grpc.aio.insecure_channel(address, options=options))
        call = agent_pb2_grpc.SupervisorStub(channel).Connect(None)  # None: written by _write
        reader = asyncio.create_task(self._read(call, state, log))
        writer = asyncio.create_task(self._write(call, state))
        limit_s = max(MIN_KEEPALIVE_S, self._interval_s) if self._redial_quickly else CONNECT_LIMIT_S
        self._redial_quickly = False
        handshake = asyncio.create_task(_handshake_within(channel, limit_s))
        tasks = {reader, writer, handshake}
        try:
            while True:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # re-raises _Redirect, HelloRefused, AioRpcError, _Unresponsive
                if done - {handshake}:
                    break  # the stream ended
                tasks.discard(handshake)  # connected: the stream goes on
        finally:
            for task in (reader, writer, handshake):
                task.cancel()
            await asyncio.gather(reader, writer, handshake, return_exceptions=True)
            call.cancel()
            await channel.close(None)  # grace None (grpc's default); the call is cancelled already

    async def _write(self, call: StreamCall, state: _SessionState) -> None:
        await call.write(self._hello())
        loop = asyncio.get_running_loop()
        seq = 0
        next_beat = loop.time()
        is_resynced = False
        while True:
            if state.resync_wanted:  # another Welcome on this stream: a new leader behind our shard
                state.resync_wanted = False
                is_resynced = False
            now = loop.time()
            interval_s = state.interval_s or self._config.heartbeat_interval_s
            if now >= next_beat:
                seq += 1
                await call.write(
                    agent_pb2.AgentMessage(
                        heartbeat=agent_pb2.Heartbeat(seq=seq, running_generation=self._running_generation())
                    )
                )
                next_beat = now + interval_s
            if not is_resynced:
                # A new session may be a new leader whose soft state is empty: once its Welcome
                # says what it takes, tell it what we hold (each step's holdings as one message
                # where it takes SnapshotHoldings: a node holds a few steps of its own and its
                # buddy's ranks, and a whole fleet resyncs at a failover) and the once-only facts
                # it may have missed, before anything new. Heartbeats go on meanwhile.
                if not state.welcome_seen.is_set():
                    with contextlib.suppress(TimeoutError):
                        await within(state.welcome_seen.wait(), max(0.0, next_beat - loop.time()))
                    continue
                held = self._resync()
                for fact in [*(fold_holdings(held) if state.folds_holdings else held), *self._reports.sticky()]:
                    await call.write(fact)
                is_resynced = True
            # Reports are popped only after a successful write: a broken stream keeps them queued.
            while True:
                message, items, hold_s = self._reports.take(self._local_ranks() if state.folds_steps else 0,
                                                            self._local_ranks() if state.folds_holdings else 0)
                if message is None:
                    break
                await call.write(message)
                self._reports.done(items)
            until_beat_s = max(0.0, next_beat - loop.time())
            if hold_s > 0:  # a step's reports or holdings are being gathered: look again once the window closes
                await asyncio.sleep(min(hold_s, until_beat_s))
            else:
                await self._reports.wait(until_beat_s)

    async def _read(self, call: StreamCall, state: _SessionState, log: Logger) -> None:
        while True:
            message = await call.read()
            if not isinstance(message, agent_pb2.SupervisorMessage):  # grpc.aio.EOF: the stream ended
                return
            kind = message.WhichOneof("kind")
            if kind == "welcome":
                w = message.welcome
                if state.welcome_seen.is_set():
                    # Our link shard kept this stream across a leader change and replayed our Hello:
                    # the new leader's soft state is empty, so it gets the resync a new stream would.
                    state.resync_wanted = True
                    self._reports.wake()
                    log.info("welcomed_again", term=w.term, previous_term=state.term)
                state.term = w.term
                state.welcomed = state.is_session = True
                self._unreachable = []
                state.folds_steps = w.takes_step_aggregates
                state.folds_holdings = w.takes_snapshot_holdings
                state.welcome_seen.set()
                # Beat at the supervisor's expected interval when it names a sane one (it decides
                # death by it); otherwise keep the configured one.
                if math.isfinite(w.heartbeat_interval_s) and 0 < w.heartbeat_interval_s <= MAX_HEARTBEAT_INTERVAL_S:
                    state.interval_s = self._interval_s = w.heartbeat_interval_s
                log.info("welcomed", term=w.term, heartbeat_interval_s=state.interval_s or self._config.heartbeat_interval_s)
            elif kind == "directive":
                self._directive = message.directive
                result = self._on_directive(message.directive)
                if result is not None:
                    await result
            elif kind == "snapshot_retain":
                moved = self._retained(message.snapshot_retain)
                result = self._on_directive(moved) if moved is not None else None
                if result is not None:
                    await result
            elif kind == "refusal":
                r = message.refusal
                # A refusal that ends the stream (or comes before the Welcome) answers the Hello:
                # fatal only when PERMANENT. Others answer one report: logged, the stream goes on.
                if r.ends_stream or not state.welcomed:
                    if r.kind == agent_pb2.REFUSAL_KIND_PERMANENT:
                        raise HelloRefused(r.reason or "no reason given")
                    raise _RetryLater(r.reason or "no reason given")
                log.warning("message_refused", refused=r.refused, reason=r.reason,
                            retryable=r.kind != agent_pb2.REFUSAL_KIND_PERMANENT)
            elif kind == "not_leader":
                # A shard's answer names the replica holding this node; an older supervisor's, the leader.
                raise _Redirect(message.not_leader.shard_address or message.not_leader.leader_address)
            else:
                log.warning("unknown_supervisor_message", kind=kind)


def _is_silent_loss(exc: grpc.aio.AioRpcError) -> bool:
    """gRPC ended the stream because a ping went unanswered: "ping timeout" in grpcio 1.85,
    "keepalive watchdog timeout" in older ones. A grpcio that words it otherwise costs one more
    dial of the silent replica, given up after one interval (see CONNECT_LIMIT_S)."""
    details = (exc.details() or "").lower()
    return "ping timeout" in details or "keepalive" in details


async def _handshake_within(channel: grpc.aio.Channel, limit_s: float) -> None:
    """Returns once `channel` is connected; raises _Unresponsive when it is not within `limit_s`. A
    refused connection fails the stream itself at once (UNAVAILABLE); this catches the silent kind."""
    try:
        await within(channel.channel_ready(), limit_s)
    except TimeoutError:
        raise _Unresponsive(f"no HTTP/2 handshake within {limit_s:g}s (a stopped process or a lost host)") from None


class _SessionState:
    __slots__ = ("folds_holdings", "folds_steps", "interval_s", "is_session", "resync_wanted", "term",
                 "welcome_seen", "welcomed")

    def __init__(self) -> None:
        self.welcomed = False
        self.term = 0  # the last Welcome's term
        self.resync_wanted = False  # another Welcome came on this stream: send the resync again
        self.folds_steps = False  # the Welcome said the supervisor takes StepAggregates
        self.folds_holdings = False  # ... and SnapshotHoldings
        self.welcome_seen = asyncio.Event()  # this session's Welcome came (the resync waits for it)
        self.is_session = False  # a Welcome came: this was a working session (not just a redirect)
        self.interval_s: float | None = None  # the Welcome's heartbeat interval, once known
