"""Every EventLog backend passes the same contract (tests/support/eventlog_contract.py)."""

from __future__ import annotations

import itertools
import pathlib

import pytest

from ftsup.supervisor.eventlog.embedded import EmbeddedLog
from ftsup.supervisor.eventlog.memory import MemoryLog
from tests.support.eventlog_contract import CONTRACT

_counter = itertools.count()


@pytest.fixture(params=["memory", "embedded"])
def make_log(request: pytest.FixtureRequest, tmp_path: pathlib.Path):
    if request.param == "memory":
        return MemoryLog
    # Small segments so the contract also crosses segment boundaries and compacts whole ones.
    return lambda: EmbeddedLog(tmp_path / f"log{next(_counter)}", segment_bytes=4096)


@pytest.mark.parametrize("check", CONTRACT, ids=[c.__name__ for c in CONTRACT])
async def test_backend_honours_the_contract(make_log, check) -> None:
    await check(make_log)
