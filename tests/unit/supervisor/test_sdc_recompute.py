"""The SDC recompute check through the pure core: the schedule, the verifier (never the suspect),
the hold on commits and completion, a third node's confirmation before any quarantine, the taint
and the restore from before the step, inconclusive timeouts, and what the policy concludes."""

from __future__ import annotations

import dataclasses

import pytest

from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.directives import directive_for
from ftsup.supervisor.core.errors import InvalidEvent
from ftsup.supervisor.core.events import (
    EndReason,
    GenerationEnded,
    GenerationStarted,
    JobCompleted,
    NodeQuarantined,
    QuarantineCause,
    SdcCheckFinished,
    SdcCheckStarted,
    SdcRankDigests,
    SdcSuspected,
    SdcVerdict,
    SnapshotCommitted,
)
from ftsup.supervisor.core.evolve import evolve
from ftsup.supervisor.core.inputs import Heartbeat, RankFinished, SdcCheckResult, SnapshotReport, StepReport, Tick
from ftsup.supervisor.core.policies import recompute
from ftsup.supervisor.core.policies.recompute import Outcome, RecomputeConfig, VerifierCandidate
from tests.support.builders import Sim, config, hello

NODES = ("n1", "n2", "n3", "n4")
EVERY = 5


def cluster(*, spares: int = 1, every: int = EVERY, timeout_s: float = 60.0, nodes: int = 4) -> Sim:
    """`nodes` nodes of one rank each (data-parallel replicas), `spares` spares, generation 1."""
    base = config(nodes=nodes, ranks_per_node=1)
    sim = Sim(dataclasses.replace(base, recompute=RecomputeConfig(every_steps=every, timeout_s=timeout_s)))
    for i, node in enumerate(NODES[:nodes]):
        sim.events(hello(node, stream_id=i + 1))
    for i in range(spares):
        sim.events(hello(f"s{i + 1}", spare=True, stream_id=20 + i))
    assert sim.state.generation is not None and sim.state.generation.number == 1
    return sim


def step(sim: Sim, n: int, grads: dict[int, str] | None = None, params: dict[int, str] | None = None) -> list:
    """Every rank reports step `n` (local-gradient and parameter digests), then its snapshot is held twice."""
    generation = sim.state.generation
    assert generation is not None
    out = []
    for rank in range(generation.world_size):
        node = generation.node_of_rank(rank)
        grad = (grads or {}).get(rank, f"g{n}.{rank}")
        param = (params or {}).get(rank, f"p{n}")
        out += sim.events(StepReport(node, generation.number, rank, n, 0.1, 0.05, 2.0, param,
                                     local_grad_digest=grad))
    if sim.state.generation is None or sim.state.generation.number != generation.number:
        return out  # the step's vote ended the generation
    for member in generation.members:
        for holder in filter(None, (member.node_id, member.buddy_node_id)):
            out += sim.events(SnapshotReport(holder, generation.number, member.ranks[0], n, (holder,), 10))
    return out


def answer(sim: Sim, check: SdcCheckStarted, grads: dict[int, str] | None = None,
           params: dict[int, str] | None = None, error: str = "") -> list:
    """The verifier's answer: by default exactly what the ranks reported."""
    recomputed = tuple(
        SdcRankDigests(d.rank, check.verifier_node_id, (grads or {}).get(d.rank, d.grad_digest),
                       (params or {}).get(d.rank, d.param_digest))
        for d in check.reported
    ) if not error else ()
    return sim.events(SdcCheckResult(check.verifier_node_id, check.check_id, check.step, check.rank, recomputed, error))


def tick(sim: Sim, dt: float) -> list:
    """Time passes with every node heard from: only the recompute timeout can act."""
    sim.now += dt
    for node_id in sim.state.nodes:
        sim.events(Heartbeat(node_id, 1, 0))
    return sim.events(Tick())


def of(events: list, kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


# -- the schedule and the verifier --------------------------------------------------------------------


def test_a_scheduled_check_replays_the_step_on_a_spare_and_holds_its_commit_back():
    sim = cluster()
    for n in range(1, EVERY):
        step(sim, n)
    events = step(sim, EVERY)
    (check,) = of(events, SdcCheckStarted)
    rank = recompute.scheduled_rank(EVERY, 4, sim.config.recompute)
    assert (check.step, check.rank, check.suspect_node_id, check.generation) == (EVERY, rank, NODES[rank], 1)
    assert check.verifier_node_id == "s1"  # idle, and never the suspect
    assert [d.rank for d in check.reported] == [0, 1, 2, 3]  # a small world: the whole step is replayed
    assert check.reported[2] == SdcRankDigests(2, "n3", f"g{EVERY}.2", f"p{EVERY}")
    assert check.snapshot_holders[0] == NODES[(rank + 1) % 4]  # the buddy first, then the rank's node
    assert sim.state.snapshot is not None and sim.state.snapshot.step == EVERY - 1  # step 5 is held back
    step(sim, EVERY + 1)
    assert sim.state.snapshot.step == EVERY - 1
    with pytest.raises(InvalidEvent, match="recompute check of step 5 is open"):
        evolve(sim.state, SnapshotCommitted(1, EVERY + 1))
    order = directive_for(sim.state, sim.config.job, "s1", "").sdc_checks
    assert [(o.check_id, o.step, o.rank, o.replay_ranks) for o in order] == [(check.check_id, EVERY, rank, (0, 1, 2, 3))]
    assert order[0].sources[0].node_id == check.snapshot_holders[0] and order[0].argv == sim.config.job.argv
    assert directive_for(sim.state, sim.config.job, "n1", "").sdc_checks == ()


def test_a_matching_recompute_releases_the_held_commits():
    sim = cluster()
    for n in range(1, EVERY + 3):
        step(sim, n)
    (check,) = of(sim.log, SdcCheckStarted)
    events = answer(sim, check)
    finished, committed = events
    assert finished.verdict is SdcVerdict.MATCH and finished.culprit_node_ids == () and finished.tainted_from_step is None
    assert committed == SnapshotCommitted(1, EVERY + 2)  # the newest step held by every rank
    assert sim.state.sdc_checks == ()


def test_only_one_scheduled_check_runs_at_a_time():
    sim = cluster(every=2)
    for n in range(1, 5):
        step(sim, n)
    assert [c.step for c in of(sim.log, SdcCheckStarted)] == [2]  # step 4 was due while step 2's ran


def test_no_check_without_a_node_other_than_the_suspect_or_without_gradient_digests():
    sim = cluster(spares=0, nodes=1)
    for n in range(1, EVERY + 1):
        step(sim, n)
    assert of(sim.log, SdcCheckStarted) == []  # one node: nobody else can replay its step
    sim = cluster()
    for n in range(1, EVERY + 1):
        step(sim, n, grads={r: "" for r in range(4)})
    assert of(sim.log, SdcCheckStarted) == []  # the trainer reports no local-gradient digest: unknown, skip


def test_no_check_when_no_copy_of_the_step_before_is_known():
    sim = cluster()
    generation = sim.state.generation
    for n in range(1, EVERY + 1):
        if n == EVERY - 1:  # the trainer snapshots every other step: step 4 was never held
            for rank in range(4):
                sim.events(StepReport(generation.node_of_rank(rank), 1, rank, n, 0.1, 0.05, 2.0, f"p{n}",
                                      local_grad_digest=f"g{n}.{rank}"))
            continue
        step(sim, n)
    assert of(sim.log, SdcCheckStarted) == []


def test_the_verifier_is_idle_before_training_outside_the_suspects_domain_and_never_excluded():
    c = [VerifierCandidate("n1", True, "rack-a", 1), VerifierCandidate("n2", True, "rack-b", 2),
         VerifierCandidate("s1", False, "rack-a", 5), VerifierCandidate("s2", False, "rack-b", 6)]
    assert recompute.choose_verifier(c, frozenset({"n1"}), "rack-a") == "s2"
    assert recompute.choose_verifier(c, frozenset({"n1", "s2"}), "rack-a") == "s1"
    assert recompute.choose_verifier(c, frozenset({"s1", "s2", "n1"}), "rack-b") == "n2"
    assert recompute.choose_verifier(c, frozenset({"s1", "s2", "n1", "n2"}), "") is None


# -- mismatch, confirmation, conviction ---------------------------------------------------------------


def test_a_gradient_mismatch_confirmed_by_a_third_node_quarantines_the_culprit_and_restores_before_the_step():
    sim = cluster()
    for n in range(1, EVERY + 3):
        step(sim, n)
    (first,) = of(sim.log, SdcCheckStarted)
    sim.now += 10  # past the spare grace
    events = answer(sim, first, grads={2: "clean"}, params={r: "p-clean" for r in range(4)})
    finished, second = events
    assert finished.verdict is SdcVerdict.MISMATCH and finished.culprit_node_ids == ()  # not yet: unconfirmed
    assert "rank 2 local gradient" in finished.detail and "asking n1 for a second opinion" in finished.detail
    assert second.confirms_check_id == first.check_id and second.suspect_node_id == "n3"
    assert second.verifier_node_id not in {"s1", "n3"}  # neither the first verifier nor the culprit
    assert sim.state.snapshot.step == EVERY - 1  # still held: the second opinion holds it
    events = answer(sim, second, grads={2: "clean"}, params={r: "p-clean" for r in range(4)})
    done, ended, quarantined, started = events
    assert done.verdict is SdcVerdict.MISMATCH and done.culprit_node_ids == ("n3",)
    assert done.tainted_from_step == EVERY
    assert isinstance(ended, GenerationEnded) and ended.reason is EndReason.NODE_QUARANTINED and ended.node_id == "n3"
    assert quarantined == NodeQuarantined("n3", quarantined.reason, sim.log.index(done) + 1,
                                         QuarantineCause.SDC)  # evidence: the verdict
    assert quarantined.reason.startswith("SDC: recompute of step 5")
    assert isinstance(started, GenerationStarted) and started.restore_step == EVERY - 1
    assert [m.node_id for m in started.members] == ["n1", "n2", "s1", "n4"]
    assert not of(sim.log, SdcSuspected)  # the digest vote never saw it
    assert sim.state.sdc_tainted_from_step is None  # lifted: the new generation recomputes from step 5


def test_a_second_opinion_that_agrees_with_the_rank_quarantines_the_first_verifier_instead():
    sim = cluster(spares=2)
    for n in range(1, EVERY + 1):
        step(sim, n)
    (first,) = of(sim.log, SdcCheckStarted)
    assert first.verifier_node_id == "s1"
    (_, second) = answer(sim, first, grads={1: "wrong"})
    assert second.verifier_node_id == "s2"
    done, committed, quarantined = answer(sim, second)
    assert committed == SnapshotCommitted(1, EVERY)  # released first: step 5 was computed right
    assert done.verdict is SdcVerdict.MATCH and done.culprit_node_ids == ("s1",) and done.tainted_from_step is None
    assert quarantined.node_id == "s1" and "verifier s1 recomputed step 5 wrongly" in quarantined.reason
    assert sim.state.generation is not None and sim.state.generation.number == 1  # training was right: it goes on


def test_two_recomputes_that_disagree_with_each_other_convict_nobody():
    sim = cluster(spares=2)
    for n in range(1, EVERY + 1):
        step(sim, n)
    (first,) = of(sim.log, SdcCheckStarted)
    (_, second) = answer(sim, first, grads={1: "wrong"})
    (done, *rest) = answer(sim, second, grads={1: "other"})
    assert done.verdict is SdcVerdict.INCONCLUSIVE and done.culprit_node_ids == () and not of(rest, NodeQuarantined)


def test_a_mismatch_with_no_third_node_free_is_recorded_and_acts_on_nobody():
    sim = cluster(spares=1, nodes=1)
    for n in range(1, EVERY + 1):
        step(sim, n)
    (first,) = of(sim.log, SdcCheckStarted)
    (done, _) = answer(sim, first, grads={0: "other"})
    assert done.verdict is SdcVerdict.MISMATCH and "no third node" in done.detail
    assert not of(sim.log, NodeQuarantined) and sim.state.sdc_checks == ()


def test_a_split_vote_is_recomputed_and_the_side_that_updated_wrongly_is_named():
    sim = cluster(nodes=2, spares=2, every=0)  # two replicas: any disagreement is a split
    step(sim, 1)
    events = step(sim, 2, params={0: "p2", 1: "flipped"})
    suspects = of(events, SdcSuspected)
    (check,) = of(events, SdcCheckStarted)
    assert [s.majority_digest for s in suspects] == ["", ""] and check.reason.startswith("digest vote split")
    assert check.verifier_node_id == "s1" and [d.param_digest for d in check.reported] == ["p2", "flipped"]
    sim.now += 10
    (_, second) = answer(sim, check, params={0: "p2", 1: "p2"})
    assert second.verifier_node_id == "s2" and second.suspect_node_id == "n2"
    (done, *rest) = answer(sim, second, params={0: "p2", 1: "p2"})
    assert done.culprit_node_ids == ("n2",) and "rank 1 parameters" in done.detail
    assert [q.node_id for q in of(rest, NodeQuarantined)] == ["n2"]


# -- timeouts, completion, admission ------------------------------------------------------------------


def test_a_check_without_an_answer_is_inconclusive_after_the_timeout_and_commits_resume():
    sim = cluster(timeout_s=30.0)
    for n in range(1, EVERY + 2):
        step(sim, n)
    assert tick(sim, 29.0) == []
    finished, committed = tick(sim, 2.0)
    assert finished.verdict is SdcVerdict.INCONCLUSIVE and "no answer from s1 within 30s" in finished.detail
    assert committed == SnapshotCommitted(1, EVERY + 1)


def test_the_job_completes_only_once_no_check_is_open():
    sim = cluster()
    for n in range(1, EVERY + 1):
        step(sim, n)
    (check,) = of(sim.log, SdcCheckStarted)
    generation = sim.state.generation
    finished = []
    for rank in range(4):
        finished += sim.events(RankFinished(generation.node_of_rank(rank), 1, rank, EVERY, "final"))
    assert not of(finished, JobCompleted) and sim.state.completion is None
    events = answer(sim, check)
    assert of(events, JobCompleted) == [JobCompleted(1, EVERY, "final")]


def test_answers_from_anyone_but_the_verifier_or_for_a_closed_check_are_refused():
    sim = cluster()
    for n in range(1, EVERY + 1):
        step(sim, n)
    (check,) = of(sim.log, SdcCheckStarted)
    forged = SdcCheckResult("n1", check.check_id, check.step, check.rank, (SdcRankDigests(0, "n1", "x"),))
    assert "was given to 's1', not 'n1'" in sim.feed(forged)
    wrong_rank = SdcCheckResult("s1", check.check_id, check.step, check.rank, (SdcRankDigests(7, "s1", "x"),))
    assert "asked for ranks [0, 1, 2, 3]" in sim.feed(wrong_rank)
    answer(sim, check)
    assert "is not open" in sim.feed(SdcCheckResult("s1", check.check_id, check.step, check.rank, (), "late"))


def test_a_replay_error_is_inconclusive():
    sim = cluster()
    for n in range(1, EVERY + 1):
        step(sim, n)
    (check,) = of(sim.log, SdcCheckStarted)
    (done, *_) = answer(sim, check, error="snapshot of rank 1 step 4 is held nowhere")
    assert done.verdict is SdcVerdict.INCONCLUSIVE and "could not recompute: snapshot of rank 1" in done.detail


def test_a_confirmed_verdict_on_an_older_generation_does_not_taint_the_one_in_force():
    sim = cluster(spares=2)
    for n in range(1, EVERY + 1):
        step(sim, n)
    (first,) = of(sim.log, SdcCheckStarted)
    state = evolve(sim.state, GenerationEnded(1, EndReason.OPERATOR_RESTART, "", EVERY, "test"))
    finished = SdcCheckFinished(first.check_id, SdcVerdict.MISMATCH, "a", "b", (), ("n2",), "x", None)
    assert evolve(state, finished).sdc_tainted_from_step is None
    tainted = dataclasses.replace(finished, tainted_from_step=EVERY)
    assert evolve(state, tainted).sdc_tainted_from_step == EVERY


# -- what a recompute proves (the policy) -------------------------------------------------------------


def digests(node: str, grads: list[str], params: list[str]) -> tuple[SdcRankDigests, ...]:
    return tuple(SdcRankDigests(r, node, g, p) for r, (g, p) in enumerate(zip(grads, params)))


def test_a_gradient_mismatch_names_its_rank_and_not_the_parameters_that_follow_from_it():
    reported = digests("n", ["a", "B", "c"], ["x", "x", "x"])
    result = recompute.compare(reported, digests("v", ["a", "b", "c"], ["y", "y", "y"]))
    assert result.culprits == (1,) and result.mismatched == (0, 1, 2)
    assert "consequence" in result.detail


def test_disagreeing_with_every_rank_names_nobody_but_one_rank_alone_can_be_named():
    reported = digests("n", ["a", "b"], ["x", "x"])
    assert recompute.compare(reported, digests("v", ["A", "B"], ["x", "x"])).culprits == ()
    assert recompute.compare(reported[:1], digests("v", ["A"], [""])).culprits == (0,)
    assert recompute.compare(reported, digests("v", ["a", ""], ["", ""])).is_match  # unknown: skip


def test_judge_needs_two_verifiers_agreeing_to_convict():
    reported = digests("n", ["a", "B"], ["x", "x"])
    first = digests("v1", ["a", "b"], ["y", "y"])
    assert recompute.judge(reported, (), reported).outcome is Outcome.MATCH
    assert recompute.judge(reported, (), first).outcome is Outcome.UNCONFIRMED
    assert recompute.judge(reported, first, digests("v2", ["a", "b"], ["y", "y"])).outcome is Outcome.CONVICTED
    assert recompute.judge(reported, first, reported).outcome is Outcome.VERIFIER_WRONG
    assert recompute.judge(reported, first, digests("v2", ["a", "c"], ["z", "z"])).outcome is Outcome.INCONCLUSIVE


def test_the_schedule_and_the_replayed_ranks():
    rc = RecomputeConfig(every_steps=5, full_replay_max_world=4)
    assert [s for s in range(1, 16) if recompute.is_scheduled(s, rc)] == [5, 10, 15]
    assert [recompute.scheduled_rank(s, 4, rc) for s in (5, 10, 15, 20)] == [1, 2, 3, 0]
    assert recompute.replay_ranks(2, 4, rc, model_parallel_size=1) == (0, 1, 2, 3)
    assert recompute.replay_ranks(2, 8, rc, model_parallel_size=1) == (2,)
    assert recompute.replay_ranks(2, 4, rc, model_parallel_size=2) == (2,)
    assert not recompute.is_scheduled(5, RecomputeConfig())
    with pytest.raises(ValueError, match="timeout_s"):
        RecomputeConfig(timeout_s=0.0)
    assert isinstance(CoreConfig(job=config().job).recompute, RecomputeConfig)


# -- properties ---------------------------------------------------------------------------------------


def _script_inputs():
    from hypothesis import strategies as st

    nodes = st.sampled_from(list(NODES[:2]) + ["s1", "s2"])
    return st.one_of(  # answers listed twice: drawn as often as steps
        st.tuples(st.just("step"), st.sampled_from([0, 0, 0, 0, 1, -1]),
                  st.dictionaries(st.integers(0, 1), st.sampled_from(["x", "y"]))),
        st.tuples(st.just("answer"), st.sampled_from(["same", "grad", "param", "error"]), st.integers(0, 3)),
        st.tuples(st.just("answer"), st.sampled_from(["same", "grad", "param", "error"]), st.integers(0, 3)),
        st.tuples(st.just("tick"), st.floats(0.0, 40.0)),
        st.tuples(st.just("finish"), st.integers(0, 1)),
        st.tuples(st.just("hello"), nodes, st.integers(1, 2)),
    )


def test_checks_in_any_order_of_steps_answers_timeouts_and_restarts_always_fold_and_hold_commits():
    """Whatever the verifiers answer and whenever: every decision folds (Sim raises otherwise; evolve
    refuses a commit at or after an open check's step), and the log replays to the same state."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ftsup.supervisor.core.evolve import evolve_all
    from ftsup.supervisor.core.state import ClusterState

    @settings(max_examples=150, deadline=None)
    @given(st.lists(_script_inputs(), max_size=40))
    def run(script):
        sim = cluster(nodes=2, spares=2, every=2, timeout_s=30.0)
        for item in script:
            generation = sim.state.generation
            if item[0] == "step" and generation is not None:
                progress = sim.soft.progress
                done = progress.max_step if progress is not None and progress.generation == generation.number else (
                    generation.restore_step or 0)
                step(sim, max(1, done + 1 + item[1]), grads=item[2])  # mostly the next step; sometimes not
            elif item[0] == "answer" and sim.state.sdc_checks:
                check = sim.state.sdc_checks[item[2] % len(sim.state.sdc_checks)]
                kind = item[1]
                answer(sim, check, grads={0: "bad"} if kind == "grad" else None,
                       params={1: "bad"} if kind == "param" else None, error="boom" if kind == "error" else "")
            elif item[0] == "tick":
                tick(sim, item[1])
            elif item[0] == "finish" and generation is not None:
                sim.feed(RankFinished(generation.node_of_rank(item[1]), generation.number, item[1], 8, "f"))
            elif item[0] == "hello":
                sim.feed(hello(item[1], spare=item[1].startswith("s"), incarnation=item[2],
                               stream_id=hash(item[1:]) % 97 + 1))
            # (A commit at or after an open check's step would not fold: evolve refuses it.)
        replayed = evolve_all(ClusterState(), sim.log)
        assert replayed.sdc_checks == sim.state.sdc_checks
        assert replayed.sdc_tainted_from_step == sim.state.sdc_tainted_from_step

    run()
