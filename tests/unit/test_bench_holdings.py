"""`ftsup bench holdings` at toy size: every mode commits the step once, from 2 inputs per node
as holdings (alone, and in the runtime's folds) and from 2 per rank one by one. No timing
thresholds: the machine is shared."""

from __future__ import annotations

import json

from ftsup.bench import holdings


def test_holdings_bench_commits_the_step_once_in_both_modes(capsys):
    assert holdings.main(["--nodes", "20", "--ranks-per-node", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["holdings"]["inputs"] == 2 * 20 and result["baseline"]["inputs"] == 2 * 20 * 4
    assert result["folds"]["inputs"] == 2 * 20
    assert result["holdings"]["committed"] == result["folds"]["committed"] == result["baseline"]["committed"] == 1
    assert result["holdings"]["core_s"] > 0 and result["baseline"]["core_s"] > 0 and result["folds"]["core_s"] > 0
