"""Hypothesis strategies for messages the supervisor must refuse at its wire (issue 8, bad input).

A bad message often depends on what is true when it is sent (which generation is in force,
which ranks the sender holds), so each strategy draws a `Bad`: a category, where it is sent,
and a `build(ctx)` that turns the drawn numbers into a proto against the live `WireContext`.
`expect` names what the supervisor must answer: a Refusal on the agent stream, or a gRPC status.
The core-event strategies live in strategies.py; these are wire-only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from hypothesis import strategies as st

from ftsup.v1 import agent_pb2, events_pb2, operator_pb2

# Where a bad agent message goes: on an established node stream, or as the start of a new stream.
ON_STREAM = "stream"
NEW_STREAM = "new"


@dataclass(frozen=True, slots=True)
class WireContext:
    """What a bad message is built against: the supervisor's state at the moment of sending."""

    generation: int | None  # the generation in force
    last_generation: int
    world_size: int
    ranks_of: dict[str, tuple[int, ...]]  # node id -> ranks it holds in the generation in force
    node_ids: tuple[str, ...]  # nodes that said Hello (their streams are open)
    incarnations: dict[str, int]
    finished: dict[int, str]  # rank -> digest of RankFinished accepted in the generation in force
    held: tuple[tuple[int, int, str], ...]  # (step, rank, holder) snapshot copies reported in it
    max_message_bytes: int
    registered: tuple[str, ...] = ()  # nodes the supervisor's state knows (operator commands name them)


@dataclass(frozen=True, slots=True)
class Bad:
    category: str
    where: str  # ON_STREAM or NEW_STREAM
    sender: str  # for ON_STREAM: the node whose stream carries it
    build: Callable[[WireContext], agent_pb2.AgentMessage | bytes]  # bytes: written as they are
    expect: str | grpc.StatusCode = "refusal"
    # When what is built depends on the state (no finished rank yet: no replay to make), the
    # category it really counts under.
    category_of: Callable[[WireContext], str] | None = None

    def counted_as(self, ctx: WireContext) -> str:
        return self.category_of(ctx) if self.category_of is not None else self.category


@dataclass(frozen=True, slots=True)
class BadCall:
    """An operator call that must fail with `code`."""

    category: str
    method: str
    request: Callable[[WireContext], object]
    token: str  # "admin", "read", "wrong" or "none"
    code: grpc.StatusCode | Callable[[WireContext], grpc.StatusCode]  # a function: it depends on the state

    def expected(self, ctx: WireContext) -> grpc.StatusCode:
        return self.code(ctx) if callable(self.code) else self.code


u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
bad_seconds = st.sampled_from([math.nan, math.inf, -math.inf, -1e-9, -1.0, -1e300, 86_400.5, 1e18, 1.7e308])
good_seconds = st.floats(0.0, 1.0)


def _other_generation(ctx: WireContext, offset: int) -> int:
    """A generation that is not the one in force (stale or future); offset != 0."""
    current = ctx.generation or 0
    candidate = current + offset
    if candidate < 0 or candidate >= 2**64:
        candidate = current + 1 + abs(offset) % 1000
    return candidate if candidate != ctx.generation else candidate + 1


def _foreign_rank(ctx: WireContext, sender: str, drawn: int) -> int:
    """A rank the sender does not hold in the generation in force (out of range or a peer's)."""
    held = set(ctx.ranks_of.get(sender, ()))
    if drawn not in held:
        return drawn
    return ctx.world_size + drawn % (2**31)


def _current(ctx: WireContext) -> int:
    return ctx.generation if ctx.generation is not None else ctx.last_generation + 1


def _msg(**kind: object) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(**kind)  # type: ignore[arg-type]


def _generation_kinds(gen: int, rank: int, step: int) -> list[agent_pb2.AgentMessage]:
    return [
        _msg(step_report=agent_pb2.StepReport(generation=gen, rank=rank, step=step, step_time_s=0.1,
                                               compute_time_s=0.05, param_digest="d")),
        _msg(snapshot_report=agent_pb2.SnapshotReport(generation=gen, rank=rank, step=step, size_bytes=1)),
        _msg(rank_finished=agent_pb2.RankFinished(generation=gen, rank=rank, step=step, param_digest="d")),
        _msg(trainer_hung=agent_pb2.TrainerHung(generation=gen, rank=rank, last_step=step, silent_for_s=99.0,
                                                 limit_s=60.0)),
        _msg(checkpoint_shard=agent_pb2.CheckpointShard(generation=gen, rank=rank, checkpoint_id="c", step=step)),
    ]


def stale_generation(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """Any generation-stamped report for a generation that is not in force."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender, offset, rank, step, which = (d(st.sampled_from(senders)), d(st.integers(-5, -1) | st.integers(1, 2**40)),
                                             d(st.integers(0, 3)), d(u64), d(st.integers(0, 4)))
        return Bad("stale_or_future_generation", ON_STREAM, sender,
                   lambda ctx: _generation_kinds(_other_generation(ctx, offset), rank, step)[which])

    return draw()


def foreign_rank(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """A report for the generation in force about a rank the sender does not hold."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender, rank, step, which = d(st.sampled_from(senders)), d(u32), d(u64), d(st.sampled_from([0, 2, 3, 4]))
        return Bad("rank_not_held", ON_STREAM, sender,
                   lambda ctx: _generation_kinds(_current(ctx), _foreign_rank(ctx, sender, rank), step)[which])

    return draw()


def foreign_snapshot(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """A snapshot report from a node that is neither the rank's owner nor its buddy; or snapshot
    holdings naming such a rank after the sender's own ranks (refused whole), or whose arrays do
    not fit together (refused undecoded)."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender, rank, step, form = d(st.sampled_from(senders)), d(u32), d(u64), d(st.sampled_from(["one", "all", "shape"]))

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            far = ctx.world_size + rank % (2**31)  # no member owns it, so nobody is its buddy
            if form == "one":
                return _msg(snapshot_report=agent_pb2.SnapshotReport(generation=_current(ctx), rank=far, step=step,
                                                                     holder_node_ids=list(ctx.node_ids)))
            ranks = [*ctx.ranks_of.get(sender, ()), far]
            holdings = agent_pb2.SnapshotHoldings(generation=_current(ctx), step=step, ranks=ranks,
                                                  size_bytes=[1] * len(ranks), sha256=[""] * len(ranks))
            if form == "shape":
                holdings.size_bytes.pop()
            return _msg(snapshot_holdings=holdings)

        return Bad("snapshot_not_holder", ON_STREAM, sender, build)

    return draw()


def bad_step_numbers(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """NaN / infinite / negative / huge times, compute longer than the step, negative norms, token counts."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender = d(st.sampled_from(senders))
        field = d(st.sampled_from(["step_time_s", "compute_time_s", "compute_over_step", "grad_norm", "tokens"]))
        values: dict[str, object] = {"step_time_s": 0.2, "compute_time_s": 0.1}
        if field in ("step_time_s", "compute_time_s"):
            values[field] = d(bad_seconds)
        elif field == "compute_over_step":
            step_time = d(st.floats(0.0, 100.0))
            values.update(step_time_s=step_time, compute_time_s=step_time + d(st.floats(0.01, 1e4)))
        elif field == "grad_norm":
            values["grad_norm"] = d(st.sampled_from([-math.inf, -1.0, -1e-300]) | st.floats(max_value=-1e-12))
        else:
            values["tokens"] = d(st.integers((1 << 40) + 1, 2**64 - 1))
        step, rank_pick = d(u64), d(st.integers(0, 7))

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            held = ctx.ranks_of.get(sender) or (0,)
            return _msg(step_report=agent_pb2.StepReport(generation=_current(ctx), rank=held[rank_pick % len(held)],
                                                         step=step, **values))  # type: ignore[arg-type]

        return Bad(f"step_report_{field}", ON_STREAM, sender, build)

    return draw()


def bad_hung_times(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """A hang report for the sender's own rank with a NaN / infinite / negative silence or limit."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender, bad, good, field = (d(st.sampled_from(senders)), d(bad_seconds.filter(lambda v: not 0 <= v <= 1e6)),
                                    d(good_seconds), d(st.sampled_from(["silent_for_s", "limit_s"])))
        times = {"silent_for_s": good, "limit_s": good, field: bad}

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            held = ctx.ranks_of.get(sender) or (0,)
            return _msg(trainer_hung=agent_pb2.TrainerHung(generation=_current(ctx), rank=held[0], last_step=1,
                                                           **times))

        return Bad("trainer_hung_bad_time", ON_STREAM, sender, build)

    return draw()


def forged_trainer_exit(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """A trainer exit for a rank the sender does not run, or for a generation never started."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender, rank, code, future = (d(st.sampled_from(senders)), d(u32), d(st.integers(-(2**31), 2**31 - 1)),
                                      d(st.booleans()))

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            if future or ctx.generation is None:
                gen = ctx.last_generation + 1 + rank % 1000
                return _msg(trainer_exit=agent_pb2.TrainerExit(generation=gen, rank=rank, exit_code=code))
            return _msg(trainer_exit=agent_pb2.TrainerExit(generation=ctx.generation,
                                                           rank=_foreign_rank(ctx, sender, rank), exit_code=code))

        return Bad("trainer_exit_forged", ON_STREAM, sender, build)

    return draw()


def forged_sdc_result(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """An SDC recompute answer nobody asked for: an unknown check id (none is open in this run),
    any step and rank, digests claimed for any node, an error or none."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender = d(st.sampled_from(senders))
        check_id, step, rank = d(st.text(max_size=40)), d(u64), d(u32)
        digests = d(st.lists(st.tuples(u32, st.text(max_size=20), st.text(max_size=300)), max_size=4))
        error = d(st.sampled_from(["", "replay failed", "e" * 5000]))

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            recomputed = [events_pb2.SdcRankDigests(rank=r, node_id=n, grad_digest=g, param_digest=g)
                          for r, n, g in digests]
            return _msg(sdc_check_result=agent_pb2.SdcCheckResult(
                check_id=check_id, step=step, rank=rank, recomputed=recomputed, error=error, replay_s=0.1))

        return Bad("sdc_result_forged", ON_STREAM, sender, build)

    return draw()


def bad_xid(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """Xid codes outside 1..65535 and texts longer than the supervisor keeps (large payloads)."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender = d(st.sampled_from(senders))
        kind = d(st.sampled_from(["code", "message", "pci"]))
        code = d(st.sampled_from([0]) | st.integers(65_536, 2**32 - 1)) if kind == "code" else 79
        message = "x" * d(st.integers(4097, 200_000)) if kind == "message" else "fell off the bus"
        pci = "0" * d(st.integers(65, 10_000)) if kind == "pci" else "0000:3b:00"
        return Bad(f"xid_bad_{kind}", ON_STREAM, sender,
                   lambda ctx: _msg(xid_event=agent_pb2.XidEvent(pci=pci, code=code, message=message)))

    return draw()


def after_hello(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """A second Hello on an open stream, or a message with no kind set."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender, second, incarnation = d(st.sampled_from(senders)), d(st.booleans()), d(u64)
        if second:
            return Bad("second_hello", ON_STREAM, sender,
                       lambda ctx: _msg(hello=hello_proto(sender, incarnation)))
        return Bad("empty_message", ON_STREAM, sender, lambda ctx: agent_pb2.AgentMessage())

    return draw()


def hello_proto(node_id: str, incarnation: int, *, role: int = events_pb2.NODE_ROLE_ACTIVE,
                host: str = "127.0.0.1", peer_port: int = 9) -> agent_pb2.Hello:
    return agent_pb2.Hello(node_id=node_id, incarnation=incarnation, role=role, host=host, peer_port=peer_port, gpus=0)


def before_hello() -> st.SearchStrategy[Bad]:
    """A new stream whose first message is not a Hello."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        which, gen, rank = d(st.integers(0, 6)), d(u64), d(u32)

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            options = [*_generation_kinds(gen, rank, 1), agent_pb2.AgentMessage(),
                       _msg(heartbeat=agent_pb2.Heartbeat(seq=1, running_generation=gen))]
            return options[which]

        return Bad("message_before_hello", NEW_STREAM, "", build)

    return draw()


_BAD_NODE_IDS = st.one_of(
    st.just(""),
    st.text(min_size=65, max_size=200, alphabet="abc"),
    st.text(min_size=1, max_size=20).filter(lambda s: any(not (c.isascii() and (c.isalnum() or c in "._-")) for c in s)),
    st.integers(100_000, 2_000_000).map(lambda n: "n" * n),  # a large payload under the size limit
)


def bad_hello(registered: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """A Hello the supervisor must refuse: bad node id, role, port or host, or a taken node id
    under another incarnation (a second agent, or a forged one, claiming a connected node)."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        kind = d(st.sampled_from(["node_id", "role", "port", "host", "taken"]))
        if kind == "node_id":
            node_id = d(_BAD_NODE_IDS)
            return Bad("hello_bad_node_id", NEW_STREAM, "", lambda ctx: _msg(hello=hello_proto(node_id, 1)))
        if kind == "role":
            role = d(st.sampled_from([events_pb2.NODE_ROLE_UNSPECIFIED, 7, 2**31 - 1]))
            return Bad("hello_bad_role", NEW_STREAM, "", lambda ctx: _msg(hello=hello_proto("fresh-1", 1, role=role)))
        if kind == "port":
            port = d(st.sampled_from([0]) | st.integers(65_536, 2**32 - 1))
            return Bad("hello_bad_port", NEW_STREAM, "", lambda ctx: _msg(hello=hello_proto("fresh-2", 1, peer_port=port)))
        if kind == "host":
            return Bad("hello_no_host", NEW_STREAM, "", lambda ctx: _msg(hello=hello_proto("fresh-3", 1, host="")))
        target, incarnation = d(st.sampled_from(registered)), d(u64)

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            wrong = incarnation if incarnation != ctx.incarnations[target] else incarnation + 1
            return _msg(hello=hello_proto(target, wrong % 2**64))

        return Bad("hello_wrong_incarnation", NEW_STREAM, "", build)

    return draw()


def oversized() -> st.SearchStrategy[Bad]:
    """A message over the server's receive limit: the call fails with RESOURCE_EXHAUSTED."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        extra, as_hello = d(st.integers(1, 4096)), d(st.booleans())

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            blob = "z" * (ctx.max_message_bytes + extra)
            if as_hello:
                return _msg(hello=hello_proto("big", 1, host=blob))
            return _msg(xid_event=agent_pb2.XidEvent(pci="0000:3b:00", code=79, message=blob))

        return Bad("oversized_message", NEW_STREAM, "", build, expect=grpc.StatusCode.RESOURCE_EXHAUSTED)

    return draw()


def changed_replay(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """RankFinished again for a rank that already finished, with another digest (must be refused).
    Before any rank finished it is a RankFinished for a rank the sender does not hold."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender, digest, pick = d(st.sampled_from(senders)), d(st.text(max_size=16)), d(st.integers(0, 7))

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            mine = [r for r in ctx.finished if r in ctx.ranks_of.get(sender, ())]
            if not mine:
                return _msg(rank_finished=agent_pb2.RankFinished(
                    generation=_current(ctx), rank=_foreign_rank(ctx, sender, pick), param_digest=digest))
            rank = mine[pick % len(mine)]
            other = digest if digest != ctx.finished[rank] else digest + "x"
            return _msg(rank_finished=agent_pb2.RankFinished(generation=_current(ctx), rank=rank, step=1,
                                                             param_digest=other))

        def counted(ctx: WireContext) -> str:
            mine = [r for r in ctx.finished if r in ctx.ranks_of.get(sender, ())]
            return "rank_finished_changed_replay" if mine else "rank_not_held"

        return Bad("rank_finished_changed_replay", ON_STREAM, sender, build, category_of=counted)

    return draw()


ACCEPTED_NOOP = "accepted_noop"


def identical_replay(senders: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """A snapshot report (same holder twice) or RankFinished sent again unchanged, as agents do
    after a reconnect: accepted, and must change nothing. Sent on its own and checked for that."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        sender, pick, finished = d(st.sampled_from(senders)), d(st.integers(0, 1000)), d(st.booleans())

        def build(ctx: WireContext) -> agent_pb2.AgentMessage:
            mine = [r for r in ctx.finished if r in ctx.ranks_of.get(sender, ())]
            if finished and mine:
                rank = mine[pick % len(mine)]
                return _msg(rank_finished=agent_pb2.RankFinished(generation=_current(ctx), rank=rank, step=1,
                                                                 param_digest=ctx.finished[rank]))
            copies = [(step, rank) for step, rank, holder in ctx.held if holder == sender]
            if not copies:  # nothing reported yet: a heartbeat is the only replay there is
                return _msg(heartbeat=agent_pb2.Heartbeat(seq=pick, running_generation=ctx.generation or 0))
            step, rank = copies[pick % len(copies)]
            return _msg(snapshot_report=agent_pb2.SnapshotReport(generation=_current(ctx), rank=rank, step=step,
                                                                 holder_node_ids=[sender], size_bytes=1 << 20))

        def counted(ctx: WireContext) -> str:
            mine = [r for r in ctx.finished if r in ctx.ranks_of.get(sender, ())]
            if finished and mine:
                return "replay_identical_rank_finished"
            copies = [1 for _, _, holder in ctx.held if holder == sender]
            return "replay_identical_snapshot_report" if copies else "replay_identical_heartbeat"

        return Bad("replay_identical", ON_STREAM, sender, build, expect=ACCEPTED_NOOP, category_of=counted)

    return draw()


def undecodable() -> st.SearchStrategy[Bad]:
    """Bytes that are no AgentMessage, as the first message of a stream."""

    @st.composite
    def draw(d: st.DrawFn) -> Bad:
        tail = d(st.binary(max_size=64))

        def build(ctx: WireContext) -> bytes:
            try:
                agent_pb2.AgentMessage.FromString(tail)
            except DecodeError:
                return tail
            return b"\x0f" + tail  # field 1 with wire type 7, which does not exist

        return Bad("undecodable_bytes", NEW_STREAM, "", build)

    return draw()


def bad_agent_message(nodes: tuple[str, ...]) -> st.SearchStrategy[Bad]:
    """Every kind of bad agent message, weighted towards the cheap on-stream ones."""
    on_stream = st.one_of(stale_generation(nodes), foreign_rank(nodes), foreign_snapshot(nodes),
                          bad_step_numbers(nodes), bad_hung_times(nodes), forged_trainer_exit(nodes),
                          after_hello(nodes), changed_replay(nodes), forged_sdc_result(nodes))
    return st.one_of(on_stream, on_stream, on_stream, on_stream, bad_xid(nodes), before_hello(), bad_hello(nodes),
                     undecodable())


# -- the Operator service --------------------------------------------------------------------------

NODE_METHODS = ("Quarantine", "Unquarantine", "Drain")
ADMIN_METHODS = (*NODE_METHODS, "Restart", "CheckpointNow")
_REASONS = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != "")
_BLANK = st.sampled_from(["", " ", "\t\n", "   "])


def _admin_request(method: str, node_id: str, reason: str) -> object:
    if method in NODE_METHODS:
        return operator_pb2.NodeCommandRequest(node_id=node_id, reason=reason, operator="fuzz")
    return operator_pb2.JobCommandRequest(reason=reason, operator="fuzz")


def bad_operator_call(nodes: tuple[str, ...], never_quarantined: tuple[str, ...]) -> st.SearchStrategy[BadCall]:
    """Operator calls that must fail: no / a wrong / a read-only credential on admin methods,
    unknown or malformed node ids, blank or overlong reasons, commands the node's state forbids."""

    @st.composite
    def draw(d: st.DrawFn) -> BadCall:
        kind = d(st.sampled_from(["no_token", "wrong_token", "read_token", "unknown_node", "blank_reason",
                                  "long_reason", "unquarantine_in_service", "checkpoint_now"]))
        method = d(st.sampled_from(ADMIN_METHODS))
        node_id, reason = d(st.sampled_from(nodes)), d(_REASONS)
        code = grpc.StatusCode
        if kind in ("no_token", "wrong_token", "read_token"):
            token = {"no_token": "none", "wrong_token": "wrong", "read_token": "read"}[kind]
            expected = code.PERMISSION_DENIED if token == "read" else code.UNAUTHENTICATED
            return BadCall(f"operator_{kind}", method, lambda ctx: _admin_request(method, node_id, reason), token,
                           expected)
        if kind == "unknown_node":
            unknown = d(st.text(max_size=80).filter(lambda s: s not in nodes))
            node_method = d(st.sampled_from(NODE_METHODS))
            return BadCall("operator_unknown_node", node_method,
                           lambda ctx: _admin_request(node_method, unknown, reason), "admin",
                           code.NOT_FOUND)
        if kind in ("blank_reason", "long_reason"):
            bad_reason = d(_BLANK) if kind == "blank_reason" else "r" * d(st.integers(4097, 50_000))
            job_method = method if method != "CheckpointNow" else "Restart"
            return BadCall(f"operator_{kind}", job_method,
                           lambda ctx: _admin_request(job_method, node_id, bad_reason), "admin",
                           code.INVALID_ARGUMENT)
        if kind == "unquarantine_in_service":
            active = d(st.sampled_from(never_quarantined))
            # Refused as in service once the node registered; before, its id is unknown (NOT_FOUND).
            return BadCall("operator_unquarantine_in_service", "Unquarantine",
                           lambda ctx: _admin_request("Unquarantine", active, reason), "admin",
                           lambda ctx: code.FAILED_PRECONDITION if active in ctx.registered else code.NOT_FOUND)
        return BadCall("operator_checkpoint_now_without_store", "CheckpointNow",
                       lambda ctx: _admin_request("CheckpointNow", "", reason), "admin", code.FAILED_PRECONDITION)

    return draw()
