"""Pure agent core: directive diffing, snapshot retention, the report outbox, trainer env."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import ftsup.agent.core
from ftsup.agent.core.directives import Action, Applied, Step, diff_directive, validate_run
from ftsup.agent.core.outbox import Outbox, Priority
from ftsup.agent.core.output_tail import MAX_BYTES, MAX_LINES, bounded_tail, failure_tail
from ftsup.agent.core.retention import keys_to_drop
from ftsup.agent.core.trainer_env import RankSpec, trainer_env


def test_first_run_directive_starts_the_ranks():
    assert diff_directive(None, 1, Action.RUN, has_live_trainers=False).step is Step.START


def test_run_for_a_new_generation_with_live_trainers_restarts():
    decision = diff_directive(Applied(1, Action.RUN), 2, Action.RUN, has_live_trainers=True)
    assert decision.step is Step.RESTART
    assert "generation 1" in decision.reason


def test_same_run_directive_again_only_updates():
    assert diff_directive(Applied(3, Action.RUN), 3, Action.RUN, has_live_trainers=True).step is Step.UPDATE
    assert diff_directive(Applied(3, Action.RUN), 3, Action.RUN, has_live_trainers=False).step is Step.UPDATE


def test_directive_for_an_older_generation_is_ignored_with_a_reason():
    decision = diff_directive(Applied(5, Action.RUN), 4, Action.STANDBY, has_live_trainers=True)
    assert decision.step is Step.IGNORE
    assert "older" in decision.reason


def test_standby_stops_and_repeated_standby_is_a_noop():
    assert diff_directive(Applied(2, Action.RUN), 2, Action.STANDBY, has_live_trainers=True).step is Step.STOP
    assert diff_directive(Applied(2, Action.STANDBY), 2, Action.STANDBY, has_live_trainers=False).step is Step.NOOP


def test_directive_without_action_is_ignored():
    assert diff_directive(None, 1, None, has_live_trainers=False).step is Step.IGNORE


@given(
    applied_gen=st.integers(0, 10),
    applied_action=st.sampled_from(list(Action)),
    gen=st.integers(0, 10),
    action=st.sampled_from(list(Action)),
    live=st.booleans(),
)
def test_applying_the_same_directive_twice_never_restarts(applied_gen, applied_action, gen, action, live):
    first = diff_directive(Applied(applied_gen, applied_action), gen, action, has_live_trainers=live)
    if first.step is Step.IGNORE:
        return
    again = diff_directive(Applied(gen, action), gen, action, has_live_trainers=live)
    assert again.step in (Step.UPDATE, Step.NOOP)


def test_validate_run_rejects_malformed_rank_maps():
    assert validate_run(1, [0, 1], 2, ["python"]) is None
    assert "empty argv" in validate_run(1, [0], 1, [])
    assert "duplicate" in validate_run(1, [0, 0], 2, ["x"])
    assert "world_size" in validate_run(1, [0, 2], 2, ["x"])
    assert "no ranks" in validate_run(1, [], 2, ["x"])
    assert "reserved" in validate_run(0, [0], 1, ["x"])


def test_retention_drops_below_the_floor_keeps_the_floor_and_four_newest_above_it():
    keys = [(0, s) for s in range(1, 9)] + [(1, 5), (1, 6)]
    # Step 2 is the committed floor: kept even though four newer steps exist.
    assert keys_to_drop(keys, retain_from_step=2) == {(0, 1), (0, 3), (0, 4)}
    assert keys_to_drop(keys, retain_from_step=6) == {(0, s) for s in range(1, 6)} | {(1, 5)}


@given(st.sets(st.tuples(st.integers(0, 4), st.integers(0, 30))), st.integers(0, 30))
def test_retention_keeps_the_floor_and_at_most_four_newer_steps_per_rank(keys, floor):
    kept = set(keys) - keys_to_drop(keys, floor)
    assert all(step >= floor for _, step in kept)
    for rank in {r for r, _ in keys}:
        above = sorted(s for r, s in keys if r == rank and s > floor)
        floor_held = [floor] if (rank, floor) in keys else []
        assert sorted(s for r, s in kept if r == rank) == floor_held + above[-4:]


def test_outbox_drops_oldest_step_reports_first_and_never_essential_ones():
    box: Outbox[str] = Outbox(capacity=3)
    box.push("step1", Priority.STEP)
    box.push("exit", Priority.ESSENTIAL)
    box.push("snap", Priority.REPORT)
    box.push("step2", Priority.STEP)
    assert [box.pop() for _ in range(len(box))] == ["exit", "snap", "step2"]
    for i in range(5):
        box.push(f"exit{i}", Priority.ESSENTIAL)
    assert len(box) == 5 and box.dropped == 1  # past the bound rather than lose an exit


def test_trainer_env_puts_torchrun_and_ftsup_variables_over_the_directive_env():
    spec = RankSpec(7, 3, 1, 2, 4, "10.0.0.1", 29500, "n1", "unix:/w/agent.sock", None,
                    restart_count=2, max_restarts=3, run_id="job", error_file="/w/rank-3.gen-7.error.json")
    env = trainer_env(spec, [("RANK", "99"), ("NCCL_DEBUG", "INFO")])
    assert env == {
        "NCCL_DEBUG": "INFO", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "default", "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "job",
        "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCHELASTIC_ERROR_FILE": "/w/rank-3.gen-7.error.json",
        "OMP_NUM_THREADS": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "FTSUP_AGENT_ADDRESS": "unix:/w/agent.sock",
        "FTSUP_GENERATION": "7", "FTSUP_NODE_ID": "n1", "FTSUP_RESTORE_STEP": "", "PYTHONUNBUFFERED": "1",
    }


def test_trainer_env_leaves_omp_threads_to_the_user_and_alone_for_one_local_rank():
    spec = RankSpec(1, 0, 0, 2, 2, "h", 1, "n1", "a", None)
    assert "OMP_NUM_THREADS" not in trainer_env(spec, [], {"OMP_NUM_THREADS": "8"})
    assert trainer_env(spec, [("OMP_NUM_THREADS", "4")])["OMP_NUM_THREADS"] == "4"
    single = RankSpec(1, 0, 0, 1, 1, "h", 1, "n1", "a", None)
    assert "OMP_NUM_THREADS" not in trainer_env(single, [])


def test_a_failure_tail_is_bounded_and_prefers_torchs_recorded_exception():
    log = b"".join(f"line {i}\n".encode() for i in range(100)) + b"RuntimeError: boom\n"
    tail = failure_tail(log)
    assert tail.splitlines()[-1] == "RuntimeError: boom" and len(tail.splitlines()) == MAX_LINES
    assert len(bounded_tail(b"x" * 10_000 + b"\nend")) <= MAX_BYTES
    recorded = {"message": {"message": "ValueError: bad", "extraInfo": {"py_callstack": "Traceback...", "timestamp": "1"}}}
    assert failure_tail(log, recorded) == "Traceback...\nValueError: bad"
    assert failure_tail(log, ["not", "a", "record"]) == tail


def test_agent_core_imports_only_the_stdlib_and_itself():
    for path in Path(ftsup.agent.core.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top not in {"time", "random", "datetime", "os", "socket", "asyncio"}, f"{path.name} imports {name}"
                assert top in sys.stdlib_module_names or name.startswith("ftsup.agent.core") or top == "__future__", (
                    f"{path.name} imports {name}"
                )
