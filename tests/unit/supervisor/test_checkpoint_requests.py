"""Checkpoints off the step cadence: `checkpoint now`, the Young/Daly `auto` cadence, the lead
step every rank hears of in time, withdrawal of a request that went by, and the timeout of an
attempt whose shards never all come. Pure: milliseconds."""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator

from ftsup.supervisor import codec
from ftsup.supervisor.core import admission
from ftsup.supervisor.core import checkpoints as cp
from ftsup.supervisor.core.config import CheckpointTiming, CoreConfig, JobSpec
from ftsup.supervisor.core.decide import decide
from ftsup.supervisor.core.directives import directive_for
from ftsup.supervisor.core.events import (
    CheckpointAborted,
    CheckpointRequested,
    CheckpointStarted,
    OperatorCommand,
    RankAssignment,
)
from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.inputs import OperatorRequest, StepReport, Tick
from ftsup.supervisor.core.policies.interval import IntervalConfig
from ftsup.supervisor.core.state import (
    ClusterState,
    Completion,
    Generation,
    GenerationProgress,
    RequestedCheckpoint,
    SoftState,
)

LOC = "/tmp/ckpt"
MEMBERS = (RankAssignment("n1", (0,), "n2"), RankAssignment("n2", (1,), "n1"))
JOB = JobSpec(name="job", nodes=2, ranks_per_node=1, argv=("python", "train.py"))


def _config(**timing: object) -> CoreConfig:
    return CoreConfig(job=JOB, checkpoint_location=LOC, checkpoint_timing=CheckpointTiming(**timing))  # type: ignore[arg-type]


def _state(running: bool = True, **kw: object) -> ClusterState:
    gen = Generation(1, MEMBERS, 2, "127.0.0.1", 29500, None, 0, (), first_step=1 if running else None)
    return ClusterState(generation=gen, **kw)  # type: ignore[arg-type]


def _soft(max_step: int = 10, step_time_s: float | None = 0.5, now: float = 0.0) -> SoftState:
    soft = SoftState(started_at_s=now)
    soft.progress = GenerationProgress(generation=1, max_step=max_step, step_time_s=step_time_s, step_reports=4)
    return soft


def _step(step: int, rank: int = 0) -> StepReport:
    return StepReport(f"n{rank + 1}", 1, rank, step, 0.1, 0.1, 1.0, "d")


def test_the_requested_step_leads_the_newest_step_by_steps_and_seconds():
    config = _config(lead_steps=3, lead_s=2.0)
    assert cp.lead_step(_state(), _soft(10, step_time_s=0.5), config) == 14  # 2 s / 0.5 s = 4 steps
    assert cp.lead_step(_state(), _soft(10, step_time_s=10.0), config) == 13  # 3 steps floor
    assert cp.lead_step(_state(), _soft(10, step_time_s=None), config) == 13  # no step time yet
    assert cp.lead_step(_state(), _soft(10, step_time_s=0.001), config) == 2010


def test_checkpoint_now_is_recorded_with_the_operator_and_names_the_step():
    state, soft, config = _state(), _soft(), _config()
    request = OperatorRequest("checkpoint", "", "before the maintenance window", "alice")
    assert admission.refusal(state, soft, request, config) is None
    events = decide(state, soft, request, 0.0, config).events
    assert events[0] == OperatorCommand("checkpoint", (), "alice", "before the maintenance window")
    assert events[1] == CheckpointRequested("step-0000000014-g1", 1, 14, "checkpoint by alice: before the maintenance window")
    folded = evolve_all(state, events)
    assert folded.requested_checkpoint == RequestedCheckpoint("step-0000000014-g1", 1, 14, events[1].reason)


def test_checkpoint_now_is_refused_with_a_reason_an_operator_can_act_on():
    soft, config = _soft(), _config()
    ask = OperatorRequest("checkpoint", "", "why not", "alice")

    def refused(state: ClusterState, cfg: CoreConfig = config, request: OperatorRequest = ask) -> str:
        reason = admission.refusal(state, soft, request, cfg)
        assert reason is not None
        return reason

    assert "no checkpoint store" in refused(_state(), CoreConfig(job=JOB))
    assert "no generation is running" in refused(_state(running=False))
    assert "no generation is running" in refused(ClusterState())
    assert "completed" in refused(_state(completion=Completion(1, 20, "d")))
    requested = RequestedCheckpoint("step-0000000014-g1", 1, 14, "x")
    assert "already requested at step 14" in refused(_state(requested_checkpoint=requested))
    in_flight = evolve_all(_state(), [CheckpointStarted("step-0000000008-g1", 1, 8, 2, LOC)])
    assert "is in flight: 0 of 2 shards written" in refused(in_flight)
    assert "reason is required" in refused(_state(), request=OperatorRequest("checkpoint", "", " ", "alice"))
    assert "whole job" in refused(_state(), request=OperatorRequest("checkpoint", "n1", "x", "alice"))
    assert "SDC-tainted" in refused(_state(sdc_tainted_from_step=5))


def test_members_are_told_the_requested_step_and_spares_are_not():
    state = evolve_all(_state(), [CheckpointRequested("step-0000000014-g1", 1, 14, "x")])
    from ftsup.supervisor.core.events import NodeRegistered, NodeRole
    for node, role in (("n1", NodeRole.ACTIVE), ("n2", NodeRole.ACTIVE), ("n3", NodeRole.SPARE)):
        state = evolve_all(state, [NodeRegistered(node, 1, role, "h", 1, 1, "")])
    assert directive_for(state, JOB, "n1", "").checkpoint_steps == (14,)
    assert directive_for(state, JOB, "n2", "").checkpoint_steps == (14,)
    assert directive_for(state, JOB, "n3", "").checkpoint_steps == ()
    assert codec.directive_to_proto(directive_for(state, JOB, "n1", "")).checkpoint_steps == [14]


def test_the_requested_step_starts_a_checkpoint_without_a_cadence_and_clears_the_request():
    state = evolve_all(_state(), [CheckpointRequested("step-0000000014-g1", 1, 14, "x")])
    assert cp.on_step_report(state, _step(13), LOC, 0) == []
    started = cp.on_step_report(state, _step(14), LOC, 0)
    assert started == [CheckpointStarted("step-0000000014-g1", 1, 14, 2, LOC)]
    assert evolve_all(state, started).requested_checkpoint is None
    # A cadence step at or after the request covers it.
    covered = cp.on_step_report(state, _step(14), LOC, 7)
    assert evolve_all(state, covered).requested_checkpoint is None


def test_a_request_whose_step_went_by_while_another_was_in_flight_is_withdrawn():
    state = evolve_all(_state(), [CheckpointStarted("step-0000000010-g1", 1, 10, 2, LOC),
                                  CheckpointRequested("step-0000000014-g1", 1, 14, "x")])
    assert cp.on_step_report(state, _step(14), LOC, 0) == []  # one in flight: skipped
    withdrawn = cp.on_step_report(state, _step(15), LOC, 0)
    assert len(withdrawn) == 1 and isinstance(withdrawn[0], CheckpointAborted)
    assert withdrawn[0].checkpoint_id == "step-0000000014-g1"
    assert "went by" in withdrawn[0].reason and "step-0000000010-g1" in withdrawn[0].reason
    folded = evolve_all(state, withdrawn)
    assert folded.requested_checkpoint is None
    assert folded.pending_checkpoint is not None  # the one in flight is untouched


def test_a_request_of_an_ended_generation_is_abandoned():
    state = evolve_all(_state(), [CheckpointRequested("step-0000000014-g1", 1, 14, "x")])
    ended = ClusterState(requested_checkpoint=state.requested_checkpoint)
    aborted = cp.abandoned(ended)
    assert [type(e) for e in aborted] == [CheckpointAborted]
    assert evolve_all(ended, aborted).requested_checkpoint is None


def test_an_attempt_whose_shards_never_all_come_times_out_naming_the_missing_ranks():
    config = _config(timeout_s=30.0)
    state = evolve_all(_state(), [CheckpointStarted("step-0000000010-g1", 1, 10, 2, LOC)])
    soft = _soft(now=0.0)
    cp.note_clocks(soft, state, now=100.0)  # first seen at 100
    assert cp.on_tick(state, soft, 129.0, config) == []
    cp.note_clocks(soft, state, now=131.0)
    aborted = cp.on_tick(state, soft, 131.0, config)
    assert len(aborted) == 1 and isinstance(aborted[0], CheckpointAborted)
    assert "timed out after 31s" in aborted[0].reason and "missing ranks 0, 1" in aborted[0].reason
    assert evolve_all(state, aborted).pending_checkpoint is None
    # A complete attempt waits for its commit, however long that takes.
    from ftsup.supervisor.core.events import CheckpointShardWritten
    complete = evolve_all(state, [CheckpointShardWritten("step-0000000010-g1", r, "k", "a" * 64, 1) for r in (0, 1)])
    assert cp.on_tick(complete, soft, 500.0, config) == []


def test_a_timed_out_attempt_of_an_absurd_shard_count_names_its_first_missing_ranks_without_listing_them_all():
    """`shards` is the record's to state: a forged or corrupt one (2**62) is timed out like any
    other, naming the first 16 missing ranks; the old set(range(shards)) raised MemoryError."""
    from ftsup.supervisor.core.events import CheckpointShardWritten
    state = evolve_all(_state(), [CheckpointStarted("step-0000000010-g1", 1, 10, 2**62, LOC),
                                  CheckpointShardWritten("step-0000000010-g1", 0, "k", "a" * 64, 1)])
    soft = _soft(now=0.0)
    cp.note_clocks(soft, state, now=100.0)
    with _memory_capped(512 << 20):  # (a regression fails with MemoryError, not by filling the machine)
        aborted = cp.on_tick(state, soft, 131.0, _config(timeout_s=30.0))
    assert len(aborted) == 1 and isinstance(aborted[0], CheckpointAborted)
    assert f"1 of {2**62} shards written; missing ranks {', '.join(map(str, range(1, 17)))}, ..." in aborted[0].reason


@contextlib.contextmanager
def _memory_capped(extra_bytes: int) -> Iterator[None]:
    """This process may take at most `extra_bytes` more private memory meanwhile (RLIMIT_DATA)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))
    cap = used + extra_bytes if hard == resource.RLIM_INFINITY else min(used + extra_bytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def test_a_new_leader_counts_the_timeout_from_its_own_start():
    config = _config(timeout_s=30.0)
    state = evolve_all(_state(), [CheckpointStarted("step-0000000010-g1", 1, 10, 2, LOC)])
    soft = _soft(now=200.0)  # grace: deciding starts at 200
    cp.note_clocks(soft, state, now=150.0)
    assert cp.on_tick(state, soft, 225.0, config) == []
    assert len(cp.on_tick(state, soft, 231.0, config)) == 1


def test_auto_requests_a_checkpoint_once_the_young_daly_interval_has_passed():
    interval = IntervalConfig(prior_mtbf_s=3600.0, checkpoint_cost_s=2.0, min_interval_s=1.0)  # sqrt(2*2*3600) = 120 s
    config = _config(is_auto=True, interval=interval)
    state, soft = _state(), _soft(now=0.0)
    cp.note_clocks(soft, state, now=0.0)
    assert cp.on_tick(state, soft, 119.0, config) == []
    events = cp.on_tick(state, soft, 121.0, config)
    assert len(events) == 1 and isinstance(events[0], CheckpointRequested)
    assert events[0].step == 14 and events[0].reason.startswith("auto: 121s since the last checkpoint >= the 120s interval")
    assert "sqrt" in events[0].reason or "C = 2.0s" in events[0].reason
    # Off: never. One requested already: not twice.
    assert cp.on_tick(state, soft, 121.0, _config(is_auto=False, interval=interval)) == []
    assert cp.on_tick(evolve_all(state, events), soft, 500.0, config) == []


def test_auto_counts_from_the_newest_commit():
    from ftsup.supervisor.core.state import CommittedCheckpoint
    interval = IntervalConfig(prior_mtbf_s=3600.0, checkpoint_cost_s=2.0, min_interval_s=1.0)
    config = _config(is_auto=True, interval=interval)
    soft = _soft(now=0.0)
    cp.note_clocks(soft, _state(), now=0.0)
    committed = _state(checkpoint=CommittedCheckpoint("step-0000000008-g1", 8, "m"))
    cp.note_clocks(soft, committed, now=100.0)
    assert cp.on_tick(committed, soft, 200.0, config) == []  # 100 s since that commit
    assert len(cp.on_tick(committed, soft, 221.0, config)) == 1


def test_tick_through_decide_requests_and_times_out():
    interval = IntervalConfig(prior_mtbf_s=3600.0, checkpoint_cost_s=2.0, min_interval_s=1.0)
    config = _config(is_auto=True, interval=interval)
    state, soft = _state(), _soft(now=0.0)
    cp.note_clocks(soft, state, now=0.0)
    events = decide(state, soft, Tick(), 121.0, config).events
    assert any(isinstance(e, CheckpointRequested) for e in events)


def test_absurd_step_numbers_are_refused():
    state, soft, config = _state(), _soft(), _config()
    huge = StepReport("n1", 1, 0, (1 << 64) - 1, 0.1, 0.1, 1.0, "d")
    reason = admission.refusal(state, soft, huge, config)
    assert reason is not None and "not a step count" in reason


def test_a_requested_checkpoint_survives_a_state_snapshot():
    state = evolve_all(_state(), [CheckpointRequested("step-0000000014-g1", 1, 14, "why")])
    restored = codec.state_from_proto(codec.state_to_proto(state))
    assert restored.requested_checkpoint == state.requested_checkpoint


def test_an_aborted_attempt_is_not_restarted_by_a_late_ranks_report():
    state = evolve_all(_state(), cp.on_step_report(_state(), _step(14), LOC, 7))
    from ftsup.supervisor.core.inputs import CheckpointShardReport
    failed = CheckpointShardReport("n1", 1, 0, "step-0000000014-g1", 14, "", "", 0, "disk full")
    aborted = evolve_all(state, cp.on_shard_report(state, failed))
    assert aborted.pending_checkpoint is None and aborted.last_checkpoint_attempt == "step-0000000014-g1"
    assert cp.on_step_report(aborted, _step(14, rank=1), LOC, 7) == []  # rank 1 reports step 14 late
    assert cp.on_step_report(aborted, _step(21), LOC, 7) != []  # the next due step starts as usual
    assert codec.state_from_proto(codec.state_to_proto(aborted)).last_checkpoint_attempt == "step-0000000014-g1"
