"""JobSpec's own checks: what a job file may say before the core accepts it."""

from __future__ import annotations

import pytest

from ftsup.supervisor.core.config import JobSpec


def spec(**overrides: object) -> JobSpec:
    fields: dict[str, object] = {"name": "j", "nodes": 1, "ranks_per_node": 1, "argv": ("t",), **overrides}
    return JobSpec(**fields)  # type: ignore[arg-type]


def test_a_master_port_span_may_end_on_the_last_port_and_no_further() -> None:
    # The planner uses base + n % span: the last port is base + span - 1 (a harness reserved
    # 65472..65535 and the supervisor refused it as "..65536").
    assert spec(master_port_base=65472, master_port_span=64).master_port_base == 65472
    with pytest.raises(ValueError, match=r"65473\.\.65536 must lie within"):
        spec(master_port_base=65473, master_port_span=64)
    with pytest.raises(ValueError, match="master_port_span must be >= 1"):
        spec(master_port_span=0)
