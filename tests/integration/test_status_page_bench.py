"""`ftsup bench status_page --quick`: the long browser-memory follow in its smoke form, end to end
(real status server over a synthetic fleet folded by the real core, headless Chromium)."""

from __future__ import annotations

import json

import pytest

from ftsup.bench import status_page

pytestmark = pytest.mark.integration


def test_the_quick_follow_prints_one_json_object_with_bounded_page_state(capsys) -> None:
    assert status_page.main(["--quick"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["nodes"] == 2100 and result["records_appended"] > 1000
    assert len(result["samples"]) >= 2 and len(result["idle_samples"]) >= 2
    assert result["samples"][-1]["lag_records"] == 0  # the page caught up with the log
    assert result["events_held_max"] <= 2000  # the page's own bound on the records it keeps
    assert result["baseline"]["heap_mb_start"] > 0 and result["heap_slope_mb_per_min"] is not None


def test_bad_flags_exit_2_naming_the_limit(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        status_page.main(["--nodes", "50"])
    assert exit_info.value.code == 2 and "--nodes must be within" in capsys.readouterr().err


def test_the_heap_slope_is_a_least_squares_line() -> None:
    samples = [{"t_s": 60.0 * i, "heap_mb": 2.0 + 0.5 * i} for i in range(4)]
    assert status_page.slope_mb_per_min(samples) == 0.5
    assert status_page.slope_mb_per_min(samples[:2]) is None
