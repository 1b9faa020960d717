"""`ftsup bench overhead`'s arithmetic: fractions against the baseline of the same run, the
snapshot barrier's wait taken out of Level 2 and reported apart."""

from __future__ import annotations

from ftsup.bench.overhead import summarize


def sample(step_s: float, barrier_s: float = 0.0) -> dict[str, float]:
    return {"step_s": step_s, "barrier_s": barrier_s, "snapshot_call_s": 0.01, "capture_wait_s": 0.0}


def test_fractions_pair_each_round_with_its_baseline_and_keep_the_barrier_wait_apart() -> None:
    report = {
        "params": 100_000_000, "state_bytes": 800_000_000, "payload_bytes": 800_001_000, "held_s": 4.0,
        "digest_s": [0.5, 0.7], "steps_per_round": 1,
        "samples": {
            "baseline": [sample(1.0), sample(1.2), sample(0.8)],
            "level1": [sample(1.01), sample(1.3), sample(0.9)],
            "level2": [sample(3.05, barrier_s=2.0), sample(1.1, barrier_s=0.0), sample(5.0, barrier_s=4.0)],
        },
    }
    result = summarize(report)
    assert result["baseline_step_s"] == 1.0
    # Paired by round: level1 1.01/1.0, 1.3/1.2, 0.9/0.8 -> median 1.0833; level2 1.05, 0.9167, 1.25.
    assert result["overhead_fraction"] == {"level1": 0.0833, "level2": 0.05}
    assert result["pooled_fraction"] == {"level1": 0.01, "level2": 0.05}
    assert result["barrier_wait_s"] == 2.0 and result["barrier_wait_fraction"] == 2.0
    assert result["sdc_digest_s"] == 0.6
    # The baseline's own spread (MAD 0.2 of a 1.0 s step) is larger than the goal: no verdict.
    assert result["noise_fraction"] == 0.2 and result["goal_met"] is None and "not resolved" in result["goal_note"]


def test_a_quiet_run_gets_a_verdict() -> None:
    quiet = {"step_s": 1.0, "barrier_s": 0.0, "snapshot_call_s": 0.0, "capture_wait_s": 0.0}
    report = {"params": 1, "state_bytes": 1, "payload_bytes": 1, "held_s": 0.0, "digest_s": [0.0],
              "steps_per_round": 1,
              "samples": {"baseline": [quiet] * 3, "level1": [quiet] * 3,
                          "level2": [{**quiet, "step_s": 1.03}] * 3}}
    result = summarize(report)
    assert result["noise_fraction"] == 0.0 and result["goal_met"] is False
