"""bench/recovery.py's measurement: rank 0's step lines per epoch -> recovery, lost steps, regain."""

from __future__ import annotations

import pathlib

from ftsup.bench.recovery import Kill, StepLog


def write(path: pathlib.Path, steps: range, partial: str = "") -> None:
    path.write_text("".join(f"step {s} loss 1.0\n" for s in steps) + partial)


def test_a_kill_is_measured_from_the_killed_epochs_last_step_and_the_next_epochs_steps(tmp_path):
    files = {1: tmp_path / "gen-1.log", 2: tmp_path / "gen-2.log"}
    log = StepLog(lambda: {e: p for e, p in files.items() if p.exists()})
    write(files[1], range(1, 48), partial="step 48 lo")  # a line being written is not a step yet
    log.poll()
    assert log.latest() == (1, 47)
    kill = Kill("node-4", 47, killed_at=log.seen[1][47], epoch=1)
    assert not kill.measure(log)  # nothing after the kill yet
    write(files[2], range(41, 45))  # restored from step 40, redoing 41..44
    log.poll()
    assert not kill.measure(log)  # step 47 not completed again yet
    write(files[2], range(41, 49))
    log.poll()
    assert kill.measure(log)
    assert (kill.at_step, kill.first_step, kill.lost_steps) == (47, 41, 7)
    assert kill.recovery_s == round(log.seen[2][41] - kill.killed_at, 3)
    assert kill.regain_s == round(log.seen[2][47] - kill.killed_at, 3) >= kill.recovery_s


def test_with_nothing_lost_regain_is_the_first_step_after_the_restart(tmp_path):
    files = {3: tmp_path / "a.log", 4: tmp_path / "b.log"}
    write(files[3], range(1, 31))
    log = StepLog(lambda: files)
    log.poll()
    kill = Kill("rank 2", 30, killed_at=log.seen[3][30], epoch=3)
    write(files[4], range(31, 33))
    log.poll()
    assert kill.measure(log) and kill.lost_steps == 0 and kill.first_step == 31
    assert kill.regain_s == kill.recovery_s
