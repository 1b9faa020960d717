"""The scenario registry: every failure kind `ftsup chaos` stages, what it breaks and expects.

Shape of every run unless a scenario says otherwise: 3 active nodes with one rank each, one hot
spare, one supervisor, 14 steps of the example GPT, the fault after step 4. Node ids: node-1..3
hold ranks 0..2; a rank's buddy (its snapshot's second copy) is the next node (node-3 -> node-1).
Expectations state what ftsup does *today*; where that falls short of the goal the scenario's
docs/chaos.md entry says so.
"""

from __future__ import annotations

import os
import signal
import time

from ftsup.common.checkpoint_ids import checkpoint_id_for
from ftsup.harness.chaos import checks
from ftsup.harness.chaos.checks import after, kind, of_kind
from ftsup.harness.chaos.s3_proxy import Fault, FaultRule
from ftsup.harness.chaos.scenario import Break, Chaos, Outcome, Scenario
from ftsup.harness.cluster import ClusterError, wait_until
from ftsup.v1 import events_pb2

# -- expectation helpers (each returns problems; [] when the log shows what was expected) ---------


def _generations_after(o: Outcome) -> list[events_pb2.GenerationStarted]:
    return of_kind(after(o.records, o.brk.at), "generation_started")


def _members(generation: events_pb2.GenerationStarted) -> list[str]:
    return [m.node_id for m in generation.members]


def _replaced(o: Outcome, node: str, *, dead: bool) -> list[str]:
    """`node` left the job for good (declared dead or not, as given) and a spare took its ranks."""
    problems: list[str] = []
    later = after(o.records, o.brk.at)
    dead_nodes = [d.node_id for d in of_kind(later, "node_declared_dead")]
    if dead and node not in dead_nodes:
        problems.append(f"{node} was never declared dead (dead: {dead_nodes})")
    if not dead and node in dead_nodes:
        problems.append(f"{node} was declared dead, but it was alive")
    if node not in [q.node_id for q in of_kind(later, "node_quarantined")]:
        problems.append(f"{node} was not quarantined")
    generations = _generations_after(o)
    if not generations:
        return problems + ["no replacement generation started"]
    for generation in generations:
        if node in _members(generation):
            problems.append(f"{node} is a member of generation {generation.generation} after its fault")
    if not any(m.startswith("spare-") for m in _members(generations[-1])):
        problems.append(f"no spare in the final generation {_members(generations[-1])}")
    return problems


def _restarted_in_place(o: Outcome, reason: events_pb2.EndReason.ValueType) -> list[str]:
    """The generation ended for `reason` and restarted on the same nodes, every rank from local RAM."""
    problems: list[str] = []
    ends = of_kind(after(o.records, o.brk.at), "generation_ended")
    if not ends or ends[0].reason != reason:
        got = events_pb2.EndReason.Name(ends[0].reason) if ends else "none"
        problems.append(f"the generation did not end with {events_pb2.EndReason.Name(reason)} (got {got})")
    if of_kind(after(o.records, o.brk.at), "node_declared_dead"):
        problems.append("a node was declared dead, but every node was alive")
    generations = _generations_after(o)
    if not generations:
        return problems + ["no new generation started"]
    first = generations[0]
    if _members(first) != [f"node-{i + 1}" for i in range(o.spec.nodes)]:
        problems.append(f"the restarted generation moved nodes: {_members(first)}")
    kinds = {r.kind for r in first.restores}
    if kinds != {events_pb2.RESTORE_KIND_LOCAL_SNAPSHOT}:
        problems.append(f"ranks did not all restore from local RAM: {sorted(events_pb2.RestoreKind.Name(k) for k in kinds)}")
    return problems


def _no_restart(o: Outcome) -> list[str]:
    """The control-plane fault neither restarted the job nor judged a node."""
    problems = []
    if len(of_kind(o.records, "generation_started")) != 1:
        problems.append("the job restarted: a control-plane fault must not touch the training")
    if of_kind(o.records, "node_declared_dead"):
        problems.append("a node was declared dead during a control-plane fault")
    return problems


def _stays_out(o: Outcome) -> list[str]:
    """Once woken (SIGCONT, healed), the node's stale generation leaves no trace in the log.

    It may come back into service only through a new generation (as a spare would), never by
    resuming the generation it was cut from: no SnapshotCommitted or GenerationRunning of a
    generation is appended after that generation ended (its stale reports are refused)."""
    problems = []
    ended = {e.generation for e in of_kind(o.records, "generation_ended")}
    seen_end: set[int] = set()
    for record in o.records:
        body_kind = kind(record)
        if body_kind == "generation_ended":
            seen_end.add(record.event.generation_ended.generation)
        elif body_kind in ("snapshot_committed", "generation_running"):
            generation = getattr(record.event, body_kind).generation
            if generation in seen_end and generation in ended:
                problems.append(f"{body_kind} of ended generation {generation} at seq {record.seq} (stale reports accepted)")
    return problems


def _generation_of(chaos: Chaos) -> int:
    return chaos.generation() or 1


AGENT_RESTART_S = 2.0  # systemd/ftsup-agent.service: Restart=on-failure, RestartSec=2s

# -- the scenarios --------------------------------------------------------------------------------


def _node_sigkill(chaos: Chaos) -> Break:
    step = chaos.step()
    return Break(chaos.cluster.kill_node("node-3"), step, "node-3", "SIGKILL of the agent and its ranks")


def _agent_crash(chaos: Chaos) -> Break:
    step = chaos.step()
    at = chaos.cluster.kill_agent_only("node-2")
    # systemd brings the agent back RestartSec=2s later (systemd/ftsup-agent.service); the
    # trainers are left running here (systemd's KillMode=mixed would SIGKILL them first).
    time.sleep(AGENT_RESTART_S)
    chaos.cluster.start_agent("node-2", "active")
    # The expectation reads the new incarnation's registration from the log: wait for it, since
    # the job's remaining steps can end before the restarted agent is up (a loaded machine: the
    # job completed 0.1 s before it registered, and the records read at completion missed it).
    chaos.wait_record("node_registered", at, lambda r: r.node_id == "node-2")
    return Break(at, step, "node-2", f"SIGKILL of the agent process only, restarted {AGENT_RESTART_S:g}s later")


def _expect_agent_crash(o: Outcome) -> list[str]:
    """What ftsup does today: a restarted agent cannot re-adopt its trainers (they talk to the
    agent's socket and are refused as a stale generation), and no restart beats the reconnect
    grace, so the node is judged dead and replaced like a lost node; the new incarnation
    registers again but stays quarantined."""
    problems = _replaced(o, "node-2", dead=True)
    before = {r.event.node_registered.incarnation for r in o.records
              if kind(r) == "node_registered" and r.event.node_registered.node_id == "node-2" and r.time_unix_s < o.brk.at}
    again = [r.event.node_registered.incarnation for r in after(o.records, o.brk.at)
             if kind(r) == "node_registered" and r.event.node_registered.node_id == "node-2"]
    if not again or again[-1] in before:
        problems.append("the restarted agent did not register with a new incarnation")
    return problems


def _trainer_crash(chaos: Chaos) -> Break:
    generation = _generation_of(chaos)
    pid = chaos.cluster.trainer_pid("node-2", rank=1, generation=generation)
    if pid is None:
        raise RuntimeError(f"no trainer_started line for rank 1 of generation {generation} in node-2's agent log")
    step = chaos.step()
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    return Break(at, step, "node-2", f"SIGKILL of rank 1 (pid {pid})")


def _node_sigstop(chaos: Chaos) -> Break:
    step = chaos.step()
    at = chaos.cluster.pause_node("node-3")
    chaos.wait_record("node_declared_dead", at, lambda d: d.node_id == "node-3")
    chaos.wait_record("generation_running", at)  # the replacement trains
    chaos.cluster.resume_node("node-3")
    _wait_log_grows(chaos, "node-3")
    return Break(at, step, "node-3", "SIGSTOP of the agent and its ranks; SIGCONT once replaced")


def _wait_log_grows(chaos: Chaos, node: str) -> None:
    """Waits until the woken agent wrote something: it ran again and met the supervisor's answer."""
    path = chaos.cluster.agents[node].log_path
    size = path.stat().st_size
    wait_until(lambda: path.stat().st_size > size, 30, f"{node}'s agent to log after waking")


def _expect_hung(o: Outcome) -> list[str]:
    """The generation ends as hung and the job restarts from RAM; nobody is declared dead."""
    problems = []
    ends = of_kind(after(o.records, o.brk.at), "generation_ended")
    if not ends or ends[0].reason != events_pb2.END_REASON_HUNG:
        problems.append(f"the generation did not end as hung: {ends[:1]}")
    if of_kind(after(o.records, o.brk.at), "node_declared_dead"):
        problems.append("a node was declared dead, but every agent was alive")
    if not _generations_after(o):
        problems.append("no new generation started")
    return problems + _hung_blame(o)


def _hung_blame(o: Outcome) -> list[str]:
    """Every rank stalls in the collective with the stopped one, all at the same last step: the
    supervisor must not blame whichever agent's hang watcher fired first (a healthy node)."""
    blamed = [q.node_id for q in of_kind(after(o.records, o.brk.at), "node_quarantined")]
    innocent = [n for n in blamed if n != o.brk.node]
    return [f"hang blamed on {', '.join(innocent)} (quarantined), but the stopped rank was on {o.brk.node}"] if innocent else []


def _hung_trainer(chaos: Chaos) -> Break:
    generation = _generation_of(chaos)
    pid = chaos.cluster.trainer_pid("node-2", rank=1, generation=generation)
    if pid is None:
        raise RuntimeError(f"no trainer_started line for rank 1 of generation {generation} in node-2's agent log")
    step = chaos.step()
    at = time.time()
    os.kill(pid, signal.SIGSTOP)  # alive, silent: only the hang watcher can tell
    return Break(at, step, "node-2", f"SIGSTOP of rank 1 (pid {pid})")


def _xid(code: int, text: str):
    def break_it(chaos: Chaos) -> Break:
        step = chaos.step()
        return Break(chaos.cluster.inject_xid("node-2", code, text), step, "node-2", f"Xid {code} in the kernel log")

    return break_it


def _expect_xid(code: int, action: events_pb2.XidAction.ValueType):
    def expect(o: Outcome) -> list[str]:
        xids = [(x.node_id, x.code, x.action) for x in of_kind(o.records, "xid_reported")]
        if xids != [("node-2", code, action)]:
            return [f"expected one Xid {code} on node-2 judged {events_pb2.XidAction.Name(action)}, got {xids}"]
        return _replaced(o, "node-2", dead=False)

    return expect


def _straggler(chaos: Chaos) -> Break:
    # The slowness runs from generation 1's first step: the fault began when that step completed.
    running = chaos.wait_record("generation_running", 0.0, lambda g: g.generation == 1)
    return Break(running.time_unix_s, 0, "node-2", "rank 1 computes 250 ms slower per step")


def _sdc_flip(chaos: Chaos) -> Break:
    # The bit flips after step 6's optimizer step on rank 2: the fault began once step 5 committed.
    committed = chaos.wait_record("snapshot_committed", 0.0, lambda c: c.step >= 5)
    return Break(committed.time_unix_s, 5, "node-3", "one parameter bit flipped on rank 2 after step 6")


def _expect_sdc(o: Outcome) -> list[str]:
    suspects = [(s.node_id, s.step) for s in of_kind(o.records, "sdc_suspected")]
    if ("node-3", 6) not in suspects:
        return [f"expected an SdcSuspected for node-3 at step 6, got {suspects}"]
    return _replaced(o, "node-3", dead=False)


def _leader_kill(chaos: Chaos) -> Break:
    leader = chaos.cluster.wait_for(chaos.cluster.leader, 30, "a leader")
    step = chaos.step()
    at = chaos.cluster.kill_supervisor(leader.address)
    chaos.cluster.wait_for(lambda: (x := chaos.cluster.leader()) is not None and x.term > leader.term, 60,
                           "a new leader")
    chaos.cluster.restart_supervisor(leader.address)  # systemd brings it back: it must follow
    return Break(at, step, "", f"SIGKILL of the leader replica {leader.address} (term {leader.term})")


def _expect_leader_kill(o: Outcome) -> list[str]:
    elected = of_kind(after(o.records, o.brk.at), "leader_elected")
    if not elected:
        return ["no LeaderElected after the leader was killed"]
    return _no_restart(o)


def _etcd_member_loss(chaos: Chaos) -> Break:
    assert chaos.etcd is not None
    victim = chaos.etcd.leader_name()
    step = chaos.step()
    at = time.time()
    chaos.etcd.kill(victim)
    chaos.cluster.wait_for(lambda: chaos.cluster.leader() is not None and chaos.step() >= step + 3, 60,
                           "training and a leader with one etcd member down")
    chaos.etcd.restart(victim)
    return Break(at, step, "", f"SIGKILL of etcd member {victim} (the raft leader), restarted after 3 steps")


def _two_nodes_lost(chaos: Chaos) -> Break:
    step = chaos.step()
    at = time.time()
    chaos.cluster.kill_node("node-2")
    chaos.cluster.kill_node("node-3")  # node-2's buddy: rank 1's both RAM copies are gone
    return Break(at, step, "node-2,node-3", "SIGKILL of node-2 and its buddy node-3 at once")


def _expect_two_lost(o: Outcome) -> list[str]:
    problems = _replaced(o, "node-2", dead=True) + _replaced(o, "node-3", dead=True)
    running = {g.generation for g in of_kind(o.records, "generation_running")}
    ran = [g for g in _generations_after(o) if g.generation in running]
    if not ran:
        return problems + ["no generation ran after the loss"]
    kinds = {r.kind for r in ran[0].restores}
    # Today no checkpoint exists to fall back to: with a rank's both copies gone the job starts
    # over from step 0. With object-store checkpoints it must restore from the last one instead.
    if kinds - {events_pb2.RESTORE_KIND_FRESH, events_pb2.RESTORE_KIND_CHECKPOINT}:
        problems.append(f"restored from {sorted(events_pb2.RestoreKind.Name(k) for k in kinds)}, but rank 1's "
                        "RAM copies are all gone")
    return problems


def _failure_during_recovery(chaos: Chaos) -> Break:
    step = chaos.step()
    at = chaos.cluster.kill_node("node-3")
    replacement = chaos.wait_record("generation_started", at)
    newcomer = next(m.node_id for m in replacement.event.generation_started.members if m.node_id.startswith("spare-"))
    chaos.cluster.kill_node(newcomer)
    return Break(at, step, "node-3", f"SIGKILL of node-3, then of {newcomer} while generation "
                                     f"{replacement.event.generation_started.generation} was starting")


def _expect_failure_during_recovery(o: Outcome) -> list[str]:
    generations = _generations_after(o)
    newcomer = next((m for m in _members(generations[0]) if m.startswith("spare-")), "") if generations else ""
    other = "spare-2" if newcomer == "spare-1" else "spare-1"
    dead = [d.node_id for d in of_kind(after(o.records, o.brk.at), "node_declared_dead")]
    if sorted(dead) != sorted(["node-3", newcomer]):
        return [f"expected node-3 and the spare replacing it ({newcomer or 'none'}) declared dead, got {dead}"]
    final = generations[-1]
    problems = []
    if _members(final) != ["node-1", "node-2", other]:
        problems.append(f"the final generation is {_members(final)}, not node-1, node-2, {other}")
    kinds = {r.kind for r in final.restores}
    if events_pb2.RESTORE_KIND_FRESH in kinds:
        problems.append("a rank started fresh though every rank still had a copy in RAM")
    return problems


def _network_partition(chaos: Chaos) -> Break:
    assert chaos.proxy is not None
    step = chaos.step()
    at = time.time()
    chaos.proxy.partition()
    chaos.wait_record("node_declared_dead", at, lambda d: d.node_id == "node-3")
    chaos.wait_record("generation_running", at)
    chaos.proxy.heal()
    _wait_log_grows(chaos, "node-3")
    return Break(at, step, "node-3", "node-3's agent <-> supervisor traffic black-holed; healed once replaced")


def _partition_cost(o: Outcome) -> list[str]:
    """Known gap: the data plane is not partitioned, so the cut-off node's rank trains on with its
    peers until the verdict, but no step commits without its agent's reports: every step of the
    detection window is lost, though its buddy holds copies of them."""
    lost = checks.lost_steps(o.records, o.brk.at, o.brk.step)
    return [f"{lost} steps trained during the partition were lost: nothing commits without the cut-off "
            "agent's reports, though its buddy holds newer copies"] if lost > 1 else []


# s3_errors: checkpoints every 3 steps to SeaweedFS, every request of the job (trainers and
# supervisor) through the fault proxy. Checkpoint 3 meets one transient fault per operation kind
# and must commit. Then the persistent window opens: every upload of rank 1's shard fails, so the
# next checkpoint the trainers write fails once rank 1's retries run out, and the attempt must be
# aborted and cleaned up; the window closes and a later checkpoint must commit. The window is not
# tied to a step: a due checkpoint is skipped while the previous one still commits (the core runs
# one at a time), so the window breaks whichever attempt comes next.
_S3_EVERY = 3
_S3_TRANSIENT = checkpoint_id_for(_S3_EVERY, 1)
_S3_READ_TIMEOUT_S = 2.0  # the trainers' (--checkpoint-read-timeout-s)
_S3_RETRY_DEADLINE_S = 4.0  # the trainers' (--checkpoint-retry-deadline-s): the window outlasts it


def _step_of(checkpoint_id: str) -> int:
    return int(checkpoint_id.split("-")[1])  # step-<10 digits>-g<generation>


def _s3_faults(chaos: Chaos) -> None:
    assert chaos.checkpoints is not None and chaos.checkpoints.faults is not None
    faults, cid = chaos.checkpoints.faults, _S3_TRANSIENT
    for rule in (
        FaultRule(Fault.STATUS_503, "PUT", rf"/{cid}/__1_0\.distcp$"),  # rank 1's shard: 503 once
        FaultRule(Fault.DROP, "PUT", rf"/{cid}/__2_0\.distcp$", drop_after_bytes=256 * 1024),  # mid-upload
        FaultRule(Fault.DELAY, "PUT", rf"/{cid}/\.metadata$", delay_s=_S3_READ_TIMEOUT_S + 1.5),  # too slow
        FaultRule(Fault.STATUS_503, "GET", rf"/{cid}/shards/rank-00000\.json$"),  # the commit's read-back
        FaultRule(Fault.STATUS_500, "HEAD", rf"/{cid}/__0_0\.distcp$"),  # the commit's verification
        FaultRule(Fault.STATUS_500, "PUT", rf"/{cid}/MANIFEST\.json$"),  # the commit itself
    ):
        faults.add(rule)


def _s3_errors(chaos: Chaos) -> Break:
    assert chaos.checkpoints is not None and chaos.checkpoints.faults is not None
    faults, store, layout = chaos.checkpoints.faults, chaos.checkpoints.store, chaos.checkpoints.layout
    transient = list(faults.rules)
    chaos.wait_checkpoint_outcome(_S3_TRANSIENT)
    problems = [f"transient fault {r.fault.name} on {r.method} {r.path} fired {r.hits} times, not once"
                for r in transient if r.hits != 1]
    opened = time.time()
    window = faults.add(FaultRule(Fault.STATUS_503, "PUT", r"/step-\d{10}-g1/__1_0\.distcp$", times=None))
    aborted = chaos.wait_record("checkpoint_aborted", opened, lambda a: "could not write its shard" in a.reason)
    faults.remove(window)  # the window closes with the attempt it broke
    cid = aborted.event.checkpoint_aborted.checkpoint_id
    try:
        wait_until(lambda: not store.list(layout.directory(cid)), 10, f"the aborted attempt {cid} to be deleted")
    except ClusterError as exc:
        problems.append(f"{exc}: {len(store.list(layout.directory(cid)))} objects left")
    if window.hits < 2:
        problems.append(f"the persistent fault fired {window.hits} times: rank 1 never retried into it")
    return Break(window.first_hit_at or opened, _step_of(cid), "", f"transient S3 faults in {_S3_TRANSIENT} (503,"
                 f" a connection dropped mid-upload, an answer slower than the read timeout, 503/500 on the commit's"
                 f" read-back, verification and manifest); then {window.hits} uploads of rank 1's shard answered 503"
                 f" until {cid} was aborted", tuple(problems))


def _expect_s3_errors(o: Outcome) -> list[str]:
    """Transient faults are retried and that checkpoint commits; the persistent window aborts its
    attempt (no manifest; its objects deleted, checked right after the abort) and a later one commits."""
    problems = []
    committed = {c.checkpoint_id: c for c in of_kind(o.records, "checkpoint_committed")}
    aborted = [(a.checkpoint_id, a.reason) for a in of_kind(after(o.records, o.brk.at), "checkpoint_aborted")]
    if _S3_TRANSIENT not in committed:
        reasons = [a.reason for a in of_kind(o.records, "checkpoint_aborted") if a.checkpoint_id == _S3_TRANSIENT]
        problems.append(f"{_S3_TRANSIENT} did not commit through transient faults: {reasons or 'no outcome'}")
    broken = [c for c, reason in aborted if "could not write its shard" in reason]
    if not broken:
        return problems + [f"no attempt was aborted for rank 1's failed write after the window opened: {aborted}"]
    if broken[0] in committed:
        problems.append(f"{broken[0]} is both aborted and committed")
    if not [c for c in committed.values() if c.step > _step_of(broken[0])]:
        problems.append(f"no checkpoint committed after the aborted {broken[0]}")
    if o.store is not None and o.store.uploads:
        problems.append(f"{len(o.store.uploads)} unfinished uploads left, e.g. {o.store.uploads[0].key}")
    return problems


_HANG_FLAGS = ("--hang-multiple", "10", "--hang-floor-s", "3", "--hang-startup-s", "120")

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("node_sigkill", "SIGKILL a whole node (agent and ranks): the spare takes over from peer RAM",
             _node_sigkill, lambda o: _replaced(o, "node-3", dead=True), ("node_declared_dead",)),
    Scenario("agent_crash", "SIGKILL only the agent (its trainers live on), restart it",
             _agent_crash, _expect_agent_crash, ("node_declared_dead",)),
    Scenario("trainer_crash", "SIGKILL one trainer rank on a healthy node: restore from local RAM",
             _trainer_crash, lambda o: _restarted_in_place(o, events_pb2.END_REASON_TRAINER_EXITED),
             ("generation_ended",)),
    Scenario("node_sigstop", "SIGSTOP a whole node (silent hang), SIGCONT once replaced",
             _node_sigstop, lambda o: _replaced(o, "node-3", dead=True) + _stays_out(o),
             ("node_declared_dead",)),
    Scenario("hung_trainer", "SIGSTOP one trainer rank: the agent's hang watcher reports it",
             _hung_trainer, _expect_hung, ("generation_ended",), agent_args=_HANG_FLAGS),
    Scenario("xid_79", "Xid 79 (GPU fell off the bus) on node-2: quarantine, spare takes over",
             _xid(79, "GPU has fallen off the bus."), _expect_xid(79, events_pb2.XID_ACTION_QUARANTINE_NODE),
             ("xid_reported",)),
    Scenario("xid_48", "Xid 48 (double-bit ECC error) on node-2: its ranks move off until a GPU reset",
             _xid(48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer."),
             _expect_xid(48, events_pb2.XID_ACTION_RESET_GPU), ("xid_reported",)),
    # The straggler detector scores a cohort of at least 4 ranks (StragglerConfig.min_ranks).
    Scenario("straggler", "rank 1 is 250 ms slower per step: its node is swapped for the spare",
             _straggler, lambda o: _replaced(o, "node-2", dead=False), ("straggler_detected",), nodes=4, steps=30,
             break_at_step=1, trainer_args=("--slow-rank", "1", "--slow-ms", "250", "--slow-generation", "1")),
    Scenario("sdc_bit_flip", "one parameter bit flips on rank 2: outvoted, quarantined, restored before it",
             _sdc_flip, _expect_sdc, ("sdc_suspected",), nodes=4, break_at_step=1, needs=("sdc_flip",),
             trainer_args=("--sdc-flip-step", "6", "--sdc-flip-rank", "2", "--sdc-flip-bit", "30",
                           "--sdc-flip-tensor", "blocks.0.mlp.0.weight", "--sdc-flip-index", "17")),
    Scenario("leader_kill", "SIGKILL the leading supervisor replica (3 replicas on etcd)",
             _leader_kill, _expect_leader_kill, ("leader_elected",), supervisors=3, uses_etcd=True, spares=0),
    Scenario("etcd_member_loss", "SIGKILL the raft-leader etcd member; training and the leader go on",
             _etcd_member_loss, _no_restart, (), supervisors=3, uses_etcd=True, spares=0, steps=24),
    Scenario("two_nodes_lost", "SIGKILL a node and its buddy at once: rank 1 has no RAM copy left",
             _two_nodes_lost, _expect_two_lost, ("node_declared_dead",), spares=2),
    Scenario("failure_during_recovery", "SIGKILL a node, then the spare replacing it while it starts",
             _failure_during_recovery, _expect_failure_during_recovery, ("node_declared_dead",), spares=2),
    Scenario("network_partition", "black-hole node-3's link to the supervisor (sockets stay open), heal later",
             _network_partition, lambda o: _replaced(o, "node-3", dead=True) + _stays_out(o),
             ("node_declared_dead",), proxied_node="node-3", gaps=_partition_cost),
    Scenario("s3_errors", "S3 errors while checkpoints are written: transient ones are retried and commit, a"
             " persistent one aborts that attempt, never half-visible", _s3_errors, _expect_s3_errors,
             ("checkpoint_aborted",), spares=0, break_at_step=1, checkpoint_every_steps=_S3_EVERY, uses_s3=True,
             prepare=_s3_faults, needs=("s3_checkpoints",),
             trainer_args=("--checkpoint-read-timeout-s", f"{_S3_READ_TIMEOUT_S:g}",
                           "--checkpoint-retry-deadline-s", f"{_S3_RETRY_DEADLINE_S:g}")),
)

BY_NAME = {s.name: s for s in SCENARIOS}
