"""The invariants a chaos run must keep and the figures it reports, read from the event log.

Pure functions over `events_pb2.Record` lists: the supervisor's own timestamps measure detection
and recovery (as `ftsup demo` does), so the harness's polling rate never skews a figure. What
"acknowledged" means here: a record the supervisor returned to a reader before the fault; it
must be in the final log unchanged (same seq, same bytes), and the log must stay gapless.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ftsup.v1 import events_pb2


def kind(record: events_pb2.Record) -> str:
    return record.event.WhichOneof("kind") or ""


def of_kind(records: Iterable[events_pb2.Record], name: str) -> list:
    """The event bodies of one kind, in log order."""
    return [getattr(r.event, name) for r in records if kind(r) == name]


def after(records: Iterable[events_pb2.Record], at: float) -> list[events_pb2.Record]:
    return [r for r in records if r.time_unix_s >= at]


def gap_problems(records: Sequence[events_pb2.Record]) -> list[str]:
    """[] when seqs run 1, 2, ... without a hole or a repeat."""
    seqs = [r.seq for r in records]
    if seqs == list(range(1, len(seqs) + 1)):
        return []
    holes = sorted(set(range(1, (max(seqs) if seqs else 0) + 1)) - set(seqs))
    repeats = sorted({s for s in seqs if seqs.count(s) > 1})
    return [f"the event log is not gapless: missing seqs {holes[:10]}, repeated {repeats[:10]}"]


def events_lost(acknowledged: Sequence[events_pb2.Record], final: Sequence[events_pb2.Record]) -> int:
    """Acknowledged records absent from the final log or changed in it (any byte)."""
    by_seq = {r.seq: r.SerializeToString(deterministic=True) for r in final}
    return sum(1 for r in acknowledged if by_seq.get(r.seq) != r.SerializeToString(deterministic=True))


def checkpoints_lost(acknowledged: Sequence[events_pb2.Record], final: Sequence[events_pb2.Record]) -> int:
    """Committed checkpoints that vanished, plus ones that are half-visible in the final log.

    Half-visible: committed without having been started, with fewer shards written than it
    announced, or committed and aborted both. Every checkpoint committed before the fault must
    still be committed after it.
    """
    committed_before = {c.checkpoint_id for c in of_kind(acknowledged, "checkpoint_committed")}
    committed = {c.checkpoint_id: c for c in of_kind(final, "checkpoint_committed")}
    started = {c.checkpoint_id: c for c in of_kind(final, "checkpoint_started")}
    aborted = {c.checkpoint_id for c in of_kind(final, "checkpoint_aborted")}
    written: dict[str, set[int]] = {}
    for shard in of_kind(final, "checkpoint_shard_written"):
        written.setdefault(shard.checkpoint_id, set()).add(shard.shard)
    lost = len(committed_before - set(committed))
    for checkpoint_id in committed:
        start = started.get(checkpoint_id)
        if start is None or len(written.get(checkpoint_id, ())) < start.shards or checkpoint_id in aborted:
            lost += 1
    return lost


def first_time(records: Iterable[events_pb2.Record], kinds: Iterable[str], at: float) -> float | None:
    """Seconds from `at` to the first record at or after it whose kind is one of `kinds`."""
    wanted = set(kinds)
    for record in records:
        if record.time_unix_s >= at and kind(record) in wanted:
            return record.time_unix_s - at
    return None


def generation_at(records: Iterable[events_pb2.Record], at: float) -> int:
    """The number of the last generation started before `at` (0 before the first)."""
    number = 0
    for record in records:
        if record.time_unix_s < at and kind(record) == "generation_started":
            number = record.event.generation_started.generation
    return number


def _broken_end(records: Sequence[events_pb2.Record], at: float) -> events_pb2.GenerationEnded | None:
    """The end, after `at`, of the generation in force at `at`, unless it ended by completing."""
    broken = generation_at(records, at)
    for end in of_kind(after(records, at), "generation_ended"):
        if end.generation == broken:
            return None if end.reason == events_pb2.END_REASON_COMPLETED else end
    return None


def recovered_s(records: Sequence[events_pb2.Record], at: float) -> float | None:
    """Break -> the first step completed after recovery, by the supervisor's clock.

    When the fault ended the generation in force: the first GenerationRunning (first step done)
    of a later generation. When it did not (a control-plane fault, a fault the job rides out):
    the first step committed after the fault (SnapshotCommitted).
    """
    broken = generation_at(records, at)
    ended = _broken_end(records, at) is not None
    for record in after(records, at):
        if ended and kind(record) == "generation_running" and record.event.generation_running.generation > broken:
            return record.time_unix_s - at
        if not ended and kind(record) == "snapshot_committed":
            return record.time_unix_s - at
    return None


def lost_steps(records: Sequence[events_pb2.Record], at: float, step_at_break: int) -> int:
    """Steps trained before the fault that had to be trained again.

    The last step the broken generation reached (its GenerationEnded, or what was seen at the
    break) minus the step the first generation that ran after it restored (0: a fresh start).
    """
    broken = generation_at(records, at)
    end = _broken_end(records, at)
    if end is None:
        return 0
    last = max(end.last_step, step_at_break)
    running = {r.event.generation_running.generation for r in records if kind(r) == "generation_running"}
    for start in of_kind(after(records, at), "generation_started"):
        if start.generation > broken and start.generation in running:
            restored = start.restore_step if start.HasField("restore_step") else 0
            return max(0, last - restored)
    return last
