"""A short soak: one job through 10 mixed failures on real processes, every resource back to baseline.

The same code as `ftsup chaos soak --failures 10` (harness/chaos/soak.py): 3 nodes of one rank,
two spares kept topped up, fast heartbeats, the example GPT at its small default size. Each of
the six failure kinds runs at least once; `passed` covers every bound the soak states (digest,
lost steps, bytes arriving and held, warm pools, RSS/fds/threads/tasks, log compaction, no
restart without progress), and a failed bound is named in the message.
"""

from __future__ import annotations

import pytest

from ftsup.harness.chaos.runner import RunContext
from ftsup.harness.chaos.soak import KINDS, Soak

pytestmark = pytest.mark.integration


def test_ten_failures_leave_nothing_behind(tmp_path: pytest.TempPathFactory) -> None:
    ctx = RunContext(tmp_path, say=lambda _text: None, timeout_s=180.0)
    try:
        result = Soak(ctx, failures=10).run()
    finally:
        ctx.close()
    summary = result.summary()
    assert result.passed, summary["problems"]
    assert summary["bitwise_match"] is True, summary
    assert [f.kind for f in result.failures] == [KINDS[i % len(KINDS)] for i in range(10)]
    for failure in result.failures:
        # one step at most is in flight when a fault hits; RAM snapshots cover the rest
        assert failure.lost_steps is not None and failure.lost_steps <= 1, failure.as_dict()
        assert failure.recovered_s is not None and failure.recovered_s > 0, failure.as_dict()
    assert {"supervisor", "node-1"} <= {who for who, usage in summary["baselines"].items() if usage["end"]}
