"""SIGTERM and SIGHUP unwind a harness command once, as Ctrl-C does (harness/stop_signals.py).

Signals sent to this very process: Python runs the handler in the main thread at the next
bytecode, so each raise is seen by the `with` block that sent it.
"""

from __future__ import annotations

import os
import signal

import pytest

from ftsup.harness import cli
from ftsup.harness.stop_signals import STOP_SIGNALS, Stopped, unwinding_on_stop_signals


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_a_stop_signal_unwinds_through_finally_as_ctrl_c_does(signum: int) -> None:
    cleaned = []
    with pytest.raises(KeyboardInterrupt) as raised, unwinding_on_stop_signals():
        try:
            os.kill(os.getpid(), signum)
            pytest.fail("the signal did not interrupt the block")
        finally:
            cleaned.append(signum)
    assert cleaned == [signum]
    assert isinstance(raised.value, Stopped) and raised.value.exit_code == 128 + signum


def test_a_second_stop_signal_during_the_cleanup_is_ignored_so_it_runs_to_its_end(capfd) -> None:
    steps = []
    with pytest.raises(Stopped), unwinding_on_stop_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # a script's second kill, mid-cleanup
            os.kill(os.getpid(), signal.SIGHUP)
            steps.append("cleanup finished")
    assert steps == ["cleanup finished"]
    assert "already stopping (SIGTERM ignored)" in capfd.readouterr().err


def test_the_previous_handlers_come_back_after_the_block() -> None:
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    with unwinding_on_stop_signals():
        assert all(signal.getsignal(sig) is not before[sig] for sig in STOP_SIGNALS)
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def test_the_cli_wraps_the_commands_that_start_processes_and_not_the_daemons() -> None:
    assert {"run", "demo", "chaos", "bench", "sim"} <= cli.STOPPED_BY_UNWINDING <= set(cli.SUBCOMMANDS)
    assert not {"supervisor", "agent"} & cli.STOPPED_BY_UNWINDING  # their own graceful shutdown


def test_a_stopped_command_exits_128_plus_the_signal_after_its_cleanup(monkeypatch, capsys) -> None:
    cleaned = []

    def bench(argv: list[str]) -> int:
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            return 0
        finally:
            cleaned.append(argv)

    monkeypatch.setitem(cli.SUBCOMMANDS, "bench", (bench, "stand-in"))
    assert cli.main(["bench", "scale"]) == 128 + signal.SIGHUP
    assert cleaned == [["scale"]]
    assert "ftsup bench: stopped by SIGHUP" in capsys.readouterr().err
