"""What a link shard has yet to send the leader: its agents' messages, batched, heartbeats folded.

A shard forwards everything that can change a decision in the order its agents sent it (Hellos,
reports, stream ends). Heartbeats only refresh the leader's liveness soft state, so a session's
heartbeats waiting together are folded into its newest one: under load the leader gets one per
node per batch, however far behind the stream is. The queue is bounded; when it is full the shard
ends the stream of whoever sent the message that did not fit (its agent reconnects), instead of
growing without limit or dropping a report silently.

Step reports are folded too: a session's StepReports of one step (each rank once) waiting together
go up as one StepAggregate (the wire form the leader decides exactly as the same reports one by
one: supervisor/server/step_aggregate.py), so the leader admits one message per node per step
instead of one per rank. A run of them ends at any other message of that session (its order kept).
A session's SnapshotReports of one step fold the same way into one SnapshotHoldings, when the
leader says it takes them. And, when the leader takes them, the aggregates of one step that several
sessions' messages bring in one batch are packed into one ShardStepFold (common/step_fold_pack.py),
each session's order kept, so the leader handles one message per shard per step instead of one per
node; the nodes' SnapshotHoldings of one step likewise into one ShardHoldingsFold
(common/holdings_fold_pack.py).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from typing import Any

from ftsup.common import holdings_fold_pack, holdings_pack, step_fold_pack, step_pack
from ftsup.supervisor.core.limits import MAX_RANKS_PER_NODE_REPORT
from ftsup.supervisor.step_burst import StepBurst
from ftsup.v1 import agent_pb2, shard_pb2

# Messages waiting for the leader at most: a whole 4,000-node shard's reconnect burst (Hello,
# resync and sticky facts, ~10 messages a node) fits; a leader that stops reading does not grow it.
UP_CAPACITY = 100_000
# Items per ShardBatch at most (an item is a few hundred bytes; a step aggregate of 8 ranks ~1 KiB)...
MAX_BATCH_ITEMS = 4_096
# ...and bytes: the leader's server takes at most 4 MiB per message (server_limits), and a batch of
# trainer exits (4 KiB output tails each) or checkpoint reports would pass that by item count alone.
MAX_BATCH_BYTES = 2 * 1024 * 1024


# What a relay may hold back for a step's burst (`lingers`): the messages of a training step
# (reports, aggregates, holdings) and heartbeats. Anything else (a Hello, a stream's end, an agent
# found gone, an Xid, a hang, an exit) goes at the next write.
LINGERING_KINDS = frozenset({"heartbeat", "step_report", "step_aggregate", "snapshot_report", "snapshot_holdings"})


def _old_reports(items: Iterable[shard_pb2.Forwarded | None]) -> int:
    """How many of `items` are an older agent's StepReport or SnapshotReport."""
    return sum(1 for item in items if item is not None and item.WhichOneof("kind") == "message"
               and item.message.WhichOneof("kind") in ("step_report", "snapshot_report"))


def lingers(item: shard_pb2.Forwarded) -> bool:
    """Whether `item` may wait a few ms more for the rest of a step's burst."""
    return item.WhichOneof("kind") == "message" and item.message.WhichOneof("kind") in LINGERING_KINDS


class UpQueue:
    """Forwarded items in arrival order, a session's queued heartbeats folded into its newest."""

    def __init__(self, capacity: int = UP_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"up-queue capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: list[shard_pb2.Forwarded | None] = []
        self._heartbeat_at: dict[int, int] = {}  # session -> index of its queued heartbeat
        self.folded = 0  # heartbeats replaced by a newer one of the same session (a counter)
        self.reports_folded = 0  # step reports sent inside another's aggregate (a counter)
        self.holdings_folded = 0  # snapshot reports sent inside another's SnapshotHoldings (a counter)
        self.aggregates_packed = 0  # step aggregates sent inside a ShardStepFold, less one per fold (a counter)
        self.holdings_packed = 0  # SnapshotHoldings sent inside a ShardHoldingsFold, less one per fold (a counter)
        self._urgent = 0  # queued items that must not linger (see `lingers`)
        # Queued StepReports and SnapshotReports (an agent older than aggregates and holdings sends
        # them): `take` folds them in two passes over its batch, skipped when there are none.
        self._old_reports = 0
        self.steps = StepBurst()  # who reported the last few steps: whether a step's burst is still coming

    def __len__(self) -> int:
        return len(self._items)

    @property
    def urgent(self) -> bool:
        """Whether something queued must not wait for the rest of a step's burst (`lingers`)."""
        return self._urgent > 0

    def push(self, item: shard_pb2.Forwarded) -> bool:
        """Queues `item`; False when the queue is full (the caller ends that agent's stream)."""
        if item.WhichOneof("kind") == "message" and item.message.WhichOneof("kind") == "heartbeat":
            at = self._heartbeat_at.get(item.session)
            if at is not None:
                self._items[at] = item  # newer seq, same session: the older one says nothing more
                self.folded += 1
                return True
            if len(self._items) >= self.capacity:
                return False
            self._heartbeat_at[item.session] = len(self._items)
            self._items.append(item)
            return True
        if len(self._items) >= self.capacity:
            return False
        if item.WhichOneof("kind") == "closed":
            self._heartbeat_at.pop(item.session, None)  # a later heartbeat of it would be stale
        if not lingers(item):
            self._urgent += 1
        else:  # (a lingering item is a message)
            sent = item.message.WhichOneof("kind")
            if sent == "step_aggregate" or sent == "step_report":
                report = getattr(item.message, sent)
                self.steps.note(item.session, report.generation, report.step)
            if sent == "step_report" or sent == "snapshot_report":
                self._old_reports += 1
        self._items.append(item)
        return True

    def put_first(self, items: list[shard_pb2.Forwarded]) -> None:
        """Queues `items` ahead of everything queued, in their order, past the capacity if need be
        (a kept session's Hello replayed to a new leader: the queue held only what its agents sent
        while no relay was up, which must follow it)."""
        if not items:
            return
        self._items[:0] = items
        self._heartbeat_at = {session: at + len(items) for session, at in self._heartbeat_at.items()}
        self._urgent += sum(not lingers(item) for item in items)
        self._old_reports += _old_reports(items)

    def take(self, max_items: int = MAX_BATCH_ITEMS, max_bytes: int = MAX_BATCH_BYTES, *,
             folds_holdings: bool = False, packs_steps: bool = False,
             packs_holdings: bool = False) -> list[shard_pb2.Forwarded]:
        """Up to `max_items` items and about `max_bytes` (always at least one item), oldest first,
        removed from the queue (step reports folded; snapshot reports too with `folds_holdings`;
        back-to-back aggregates of one step packed into one ShardStepFold with `packs_steps`, and
        SnapshotHoldings into one ShardHoldingsFold with `packs_holdings`)."""
        count, size = 0, 0
        for item in self._items[:max_items]:
            if item is not None:
                size += item.ByteSize() + 8  # (the repeated field's tag and length)
                if count and size > max_bytes:
                    break
            count += 1
        head, rest = self._items[:count], self._items[count:]
        self._items = rest
        self._urgent -= sum(not lingers(item) for item in head if item is not None)
        self._heartbeat_at = {s: i - len(head) for s, i in self._heartbeat_at.items() if i >= len(head)}
        present = [item for item in head if item is not None]
        taken = present
        old = _old_reports(present) if self._old_reports else 0
        if old:
            self._old_reports -= old
            taken = fold_step_reports(present)
            self.reports_folded += len(present) - len(taken)
            if folds_holdings:
                steps_folded = taken
                taken = fold_snapshot_reports(steps_folded)
                self.holdings_folded += len(steps_folded) - len(taken)
        if packs_steps:
            unpacked = taken
            taken = pack_step_aggregates(unpacked)
            self.aggregates_packed += len(unpacked) - len(taken)
        if packs_holdings:
            unpacked = taken
            taken = pack_holdings(unpacked)
            self.holdings_packed += len(unpacked) - len(taken)
        return taken

    def clear(self) -> None:
        self._items.clear()
        self._heartbeat_at.clear()
        self._urgent = 0
        self._old_reports = 0

    def keep_sessions(self, sessions: set[int]) -> int:
        """Drops every queued item but those of `sessions` (their order kept; a "closed" notice
        is never among them: a kept session is open). Returns how many stay."""
        kept = [item for item in self._items
                if item is not None and item.session in sessions and item.WhichOneof("kind") != "closed"]
        self._items = list(kept)
        self._heartbeat_at = {}
        self._urgent = sum(not lingers(item) for item in kept)
        self._old_reports = _old_reports(kept)
        for at, item in enumerate(kept):
            if item.WhichOneof("kind") == "message" and item.message.WhichOneof("kind") == "heartbeat":
                self._heartbeat_at[item.session] = at
        return len(kept)


# Summaries whose heartbeat acks wait for the leader's admission at most; past it the oldest are
# forgotten (their acks never sent: only the fleet bench asks for acks, and counts them missing).
MAX_OWED_SUMMARIES = 1_024


class HeardSince:
    """The liveness summary being gathered: the sessions heard from since the previous one.

    To a leader that takes summaries a shard sends no heartbeat: each summary names the sessions
    heard since the last (ShardLiveness.heard), which the leader admits as one input. A heartbeat
    that asked for an ack is answered by the shard once the leader says the summary naming it was
    admitted (LivenessAdmitted), so the ack still means "the leader has it".

    Each summary also remembers when its first heartbeat was read here: once admitted,
    `on_admitted` gets the age of that oldest news (ftsup_shard_liveness_admitted_seconds), which
    is how long a node's heard time on the leader may trail what its shard read, for every
    agent, not only the bench's that ask for acks (issue 14)."""

    def __init__(self, max_owed: int = MAX_OWED_SUMMARIES, clock: Callable[[], float] = time.monotonic,
                 on_admitted: Callable[[float], None] | None = None) -> None:
        self._heard: dict[int, int] = {}  # session -> the newest heartbeat seq that asked for an ack (0: none)
        self._owed: collections.OrderedDict[int, list[tuple[int, int]]] = collections.OrderedDict()
        self._first_heard_s: collections.OrderedDict[int, float] = collections.OrderedDict()  # summary -> its oldest news
        self._max_owed = max_owed
        self._clock = clock
        self._on_admitted = on_admitted
        self._gathering_since = 0.0  # when the summary being gathered heard its first heartbeat
        self._numbered = 0  # the last summary's number on this relay
        self.asks_acks = False  # a session in the summary being gathered asked an ack

    def __bool__(self) -> bool:
        return bool(self._heard)

    def __len__(self) -> int:
        return len(self._heard)

    def note(self, session: int, ack_seq: int = 0) -> None:
        """`session` sent a heartbeat (asking an ack of `ack_seq` when non-zero)."""
        if not self._heard:
            self._gathering_since = self._clock()
        if ack_seq or session not in self._heard:
            self._heard[session] = ack_seq
        if ack_seq:
            self.asks_acks = True

    def take(self) -> tuple[list[int], int]:
        """The sessions heard (in the order first heard) and the summary's number; starts the next."""
        heard, self._heard = self._heard, {}
        self.asks_acks = False
        self._numbered += 1
        owed = [(session, seq) for session, seq in heard.items() if seq]
        if owed:
            self._owed[self._numbered] = owed
            while len(self._owed) > self._max_owed:
                self._owed.popitem(last=False)
        if heard and self._on_admitted is not None:
            self._first_heard_s[self._numbered] = self._gathering_since
            while len(self._first_heard_s) > self._max_owed:
                self._first_heard_s.popitem(last=False)
        return list(heard), self._numbered

    def admitted(self, summary: int) -> list[tuple[int, int]]:
        """The (session, heartbeat seq) acks owed by every summary up to `summary`, now due."""
        due: list[tuple[int, int]] = []
        while self._owed and next(iter(self._owed)) <= summary:
            due.extend(self._owed.popitem(last=False)[1])
        if self._first_heard_s and self._on_admitted is not None:
            now = self._clock()
            while self._first_heard_s and next(iter(self._first_heard_s)) <= summary:
                self._on_admitted(max(0.0, now - self._first_heard_s.popitem(last=False)[1]))
        return due

    def clear(self) -> None:
        """A new relay: nothing heard yet, nothing owed, numbering from 1 again."""
        self._heard.clear()
        self._owed.clear()
        self._first_heard_s.clear()
        self._numbered = 0
        self.asks_acks = False


def forwarded(session: int, node_id: str, incarnation: int,
              message: agent_pb2.AgentMessage | None = None, *, moved: bool | None = None,
              gone: str | None = None) -> shard_pb2.Forwarded:
    """One item: an agent's message, (gone set) its agent found gone after its session ended, or
    (moved set) the end of its session."""
    if message is not None:
        return shard_pb2.Forwarded(session=session, node_id=node_id, incarnation=incarnation, message=message)
    if gone is not None:
        return shard_pb2.Forwarded(session=session, node_id=node_id, incarnation=incarnation,
                                   agent_gone=shard_pb2.ShardAgentGone(detail=gone))
    return shard_pb2.Forwarded(session=session, node_id=node_id, incarnation=incarnation,
                               closed=shard_pb2.ShardSessionEnd(moved=bool(moved)))


def fold_step_reports(items: list[shard_pb2.Forwarded]) -> list[shard_pb2.Forwarded]:
    """`items` with each session's runs of StepReports of one generation and step (each rank
    once, nothing else of that session in between but heartbeats) replaced by one StepAggregate at
    the run's first position. A lone report stays as it is."""
    return _fold_runs(items, "step_report", lambda r: (r.generation, r.step),
                      lambda reports: agent_pb2.AgentMessage(step_aggregate=step_pack.pack(reports)))


def fold_snapshot_reports(items: list[shard_pb2.Forwarded]) -> list[shard_pb2.Forwarded]:
    """The same for SnapshotReports: a session's run of one step's holdings (each rank once)
    becomes one SnapshotHoldings (to a leader that takes them: LeaderBatch.takes_snapshot_holdings).
    The session's node is the holder of every one, as of each report on its own."""
    return _fold_runs(items, "snapshot_report", holdings_pack.key,
                      lambda reports: agent_pb2.AgentMessage(snapshot_holdings=holdings_pack.pack(reports)))


# Parts packed into one ShardStepFold or ShardHoldingsFold at most (the leader decides one as one
# run of its loop).
MAX_PACKED = MAX_BATCH_ITEMS


def pack_step_aggregates(items: list[shard_pb2.Forwarded], max_parts: int = MAX_PACKED) -> list[shard_pb2.Forwarded]:
    """`items` with the StepAggregates of one generation and step, of distinct sessions, each
    well-formed (step_fold_pack.packable), gathered into one ShardStepFold item at the place of the
    first, as long as no other item of an aggregate's own session lies between that place and the
    aggregate: every session's messages keep their order, and other sessions' items met on the way
    (a node's snapshot holdings between two nodes' aggregates, as when each node sends both at the
    end of a step) move behind the fold instead of cutting it. Across sessions the order was never
    the nodes' (each node's stream is its own, and a fleet's are spread over shards). A pack of one
    stays as it is, as does any other item (a malformed aggregate included)."""
    return _pack_runs(items, "step_aggregate", step_fold_pack.packable,
                      lambda parts: shard_pb2.Forwarded(step_fold=step_fold_pack.pack(parts)), max_parts)


def pack_holdings(items: list[shard_pb2.Forwarded], max_parts: int = MAX_PACKED) -> list[shard_pb2.Forwarded]:
    """The same for SnapshotHoldings (holdings_fold_pack.packable) into ShardHoldingsFolds: with a
    RAM snapshot every step, each node's own holdings and its buddy copies of a step arrive
    together, and the leader then decodes one message per fold instead of one per node. A node's
    second holdings of the step go into the next fold (chains): across nodes the order of one
    step's holdings decides nothing (a commit waits for all of them; test_holdings_fold_wire.py)."""
    return _pack_runs(items, "snapshot_holdings", _packable_holdings,
                      lambda parts: shard_pb2.Forwarded(holdings_fold=holdings_fold_pack.pack(parts)), max_parts,
                      chains=True)


def _packable_holdings(message: agent_pb2.SnapshotHoldings) -> bool:
    """Well-formed and of no more ranks than one node reports: what the leader would refuse goes
    up alone, refused to its own node, never to the fold's other parts."""
    return holdings_fold_pack.packable(message) and len(message.ranks) <= MAX_RANKS_PER_NODE_REPORT


def _sessions(item: shard_pb2.Forwarded) -> Iterable[int]:
    """The sessions whose messages `item` carries (a packed fold carries several)."""
    kind = item.WhichOneof("kind")
    if kind == "step_fold":
        return item.step_fold.sessions
    if kind == "holdings_fold":
        return item.holdings_fold.sessions
    return (item.session,)


def _pack_runs(items: list[shard_pb2.Forwarded], kind: str, packable: Callable[[Any], bool],
               fold: Callable[[list[tuple[int, Any]]], shard_pb2.Forwarded], max_parts: int,
               chains: bool = False) -> list[shard_pb2.Forwarded]:
    """`items` with the `kind` messages of one (generation, step), each `packable`, gathered into
    `fold` items at the first one's place (see pack_step_aggregates). With `chains`, a session's
    second message of the step (a node's buddy copies after its own holdings) goes into the next
    fold instead of ending the open one, so both gather across nodes; each session's messages stay
    in their order (its parts in folds one after another). Without, it ends the folds open."""
    out: list[shard_pb2.Forwarded] = []
    folds: list[list[shard_pb2.Forwarded]] = []  # the open folds, in order
    behind: list[shard_pb2.Forwarded] = []  # other items met while folds are open: after them
    key: tuple[int, int] | None = None
    last: dict[int, int] = {}  # session -> the open fold holding its latest message
    blocked: set[int] = set()  # sessions with an item behind: their next message may not move ahead

    def close() -> None:
        for parts in folds:
            if len(parts) > 1:
                out.append(fold([(item.session, getattr(item.message, kind)) for item in parts]))
            else:
                out.extend(parts)
        out.extend(behind)
        folds.clear()
        behind.clear()
        last.clear()
        blocked.clear()

    for item in items:
        message = (getattr(item.message, kind) if item.WhichOneof("kind") == "message"
                   and item.message.WhichOneof("kind") == kind else None)
        if message is None or not packable(message):
            if folds:
                behind.append(item)
                blocked.update(_sessions(item))
            else:
                out.append(item)
            continue
        this = (message.generation, message.step)
        if folds and (this != key or item.session in blocked or (not chains and item.session in last)):
            close()
        key = this
        target = last.get(item.session, -1) + 1
        while target < len(folds) and len(folds[target]) >= max_parts:
            target += 1
        if target == len(folds):
            folds.append([])
        folds[target].append(item)
        last[item.session] = target
    close()
    return out


def _fold_runs(items: list[shard_pb2.Forwarded], kind: str, key_of: Callable[[Any], tuple[int, int]],
               pack: Callable[[list[Any]], agent_pb2.AgentMessage]) -> list[shard_pb2.Forwarded]:
    """Each session's runs of `kind` messages of one key, each rank once, with nothing of that
    session in between but heartbeats, packed into one message at the run's first position."""
    runs: dict[int, list[int]] = {}  # session -> positions of its open run
    keys: dict[int, tuple[int, int]] = {}  # session -> key of its open run
    ranks: dict[int, set[int]] = {}
    closed: list[list[int]] = []
    for position, item in enumerate(items):
        session = item.session
        is_report = item.WhichOneof("kind") == "message" and item.message.WhichOneof("kind") == kind
        if not is_report:
            if not (item.WhichOneof("kind") == "message" and item.message.WhichOneof("kind") == "heartbeat"):
                if session in runs:
                    closed.append(runs.pop(session))
            continue
        report = getattr(item.message, kind)
        key = key_of(report)
        if session in runs and (keys[session] != key or report.rank in ranks[session]):
            closed.append(runs.pop(session))
        if session not in runs:
            runs[session], keys[session], ranks[session] = [], key, set()
        runs[session].append(position)
        ranks[session].add(report.rank)
    closed.extend(runs.values())
    folds = [run for run in closed if len(run) > 1]
    if not folds:
        return items
    replaced: dict[int, shard_pb2.Forwarded | None] = {}
    for run in folds:
        first = items[run[0]]
        replaced[run[0]] = shard_pb2.Forwarded(
            session=first.session, node_id=first.node_id, incarnation=first.incarnation,
            message=pack([getattr(items[p].message, kind) for p in run]))
        for position in run[1:]:
            replaced[position] = None
    out: list[shard_pb2.Forwarded] = []
    for position, item in enumerate(items):
        folded = replaced.get(position, item)
        if folded is not None:
            out.append(folded)
    return out
