"""`supervisorctl goodput --plot`'s series: the fold read at evenly spaced times (numbers, not pixels)."""

from __future__ import annotations

import pathlib

import pytest

from ftsup.supervisor.core.events import EndReason, GenerationRunning, NodeDeclaredDead, SnapshotCommitted
from ftsup.supervisor.core.goodput import goodput
from ftsup.supervisor.ctl import goodput_plot
from tests.support.png import png_size
from tests.unit.supervisor.test_goodput import ended, log, started

# The worked example of test_goodput: 5 s detection, steps 51..70 (20 s) redone, restart 10 + 15 s.
RECORDS = log(
    (1000.0, started(1)),
    (1010.0, GenerationRunning(1, 1)),
    (1060.0, SnapshotCommitted(1, 50)),
    (1085.0, NodeDeclaredDead("n2", "heartbeat overdue", 5.0)),
    (1085.0, ended(1, EndReason.NODE_LOST, 70, silent_for_s=5.0)),
    (1085.0, started(2, restore_step=50)),
    (1100.0, GenerationRunning(2, 51)),
)


def test_each_point_is_the_report_at_its_time_and_the_last_is_the_total_now() -> None:
    data = goodput_plot.series(RECORDS, now_unix_s=1200.0, samples=11)  # every 20 s from t=1000
    assert data["since_unix_s"] == 1000.0 and data["t_s"] == pytest.approx([20.0 * i for i in range(11)])
    for i, t in enumerate(data["t_s"]):
        expected = goodput([r for r in RECORDS if r.time_unix_s <= 1000.0 + t], 1000.0 + t)
        assert [data["buckets_s"][b][i] for b in goodput_plot.BUCKETS] == pytest.approx(
            [expected.productive_s, expected.detection_s, expected.restart_s, expected.lost_work_s, expected.waiting_s])
        assert sum(data["buckets_s"][b][i] for b in goodput_plot.BUCKETS) == pytest.approx(t)
    final = goodput(RECORDS, 1200.0)
    assert data["buckets_s"]["lost_work"][-1] == 20.0 and data["buckets_s"]["detection"][-1] == 5.0
    assert data["ettr"][-1] == pytest.approx(final.ettr)
    assert data["buckets_s"]["productive"][4] == 70.0  # t=80: all of 10..80 still counts (the loss is not known yet)
    assert data["buckets_s"]["productive"][5] < 70.0  # t=100: the restore to step 50 took 20 s back
    assert data["interruptions"] == [{"t_s": 85.0, "generation": 1, "reason": "node_lost"}]


def test_a_log_with_no_generation_has_no_points() -> None:
    data = goodput_plot.series([], now_unix_s=5.0)
    assert data["t_s"] == [] and data["since_unix_s"] is None


def test_the_series_draws_a_png(tmp_path: pathlib.Path) -> None:
    goodput_plot.draw(goodput_plot.series(RECORDS, 1200.0), tmp_path / "goodput.png", "unit")
    assert png_size(tmp_path / "goodput.png")[0] > 800
