"""`supervisorctl completion`: scripts bash (and zsh) accept, that complete every command."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess

import pytest

from ftsup.supervisor.ctl.main import main, parser


def script(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["completion", *args]) == 0
    return capsys.readouterr().out


def command_names() -> set[str]:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def complete(source: str, *words: str) -> list[str]:
    """What bash offers after `words` (the last one is the word being completed)."""
    line = " ".join(f"'{w}'" for w in words)
    program = f'{source}\nCOMP_WORDS=({line})\nCOMP_CWORD={len(words) - 1}\n_supervisorctl\nprintf "%s\\n" "${{COMPREPLY[@]}}"\n'
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def test_bash_accepts_the_script_and_it_lists_every_command(capsys):
    source = script(capsys, "bash")
    done = subprocess.run(["bash", "-n"], input=source, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert {"goodput", "stragglers", "checkpoints", "restart", "completion", "status"} <= command_names()
    assert set(complete(source, "supervisorctl", "")) == command_names()


def test_bash_completes_commands_flags_and_fixed_words(capsys):
    source = script(capsys, "bash")
    assert complete(source, "supervisorctl", "go") == ["goodput"]
    assert complete(source, "supervisorctl", "--address", "h:1", "str") == ["stragglers"]
    assert "now" in complete(source, "supervisorctl", "checkpoint", "")
    assert set(complete(source, "supervisorctl", "events", "--")) >= {"--at-step", "--follow", "--json", "--kind"}
    assert complete(source, "supervisorctl", "goodput", "--pro") == ["--prometheus"]
    assert complete(source, "supervisorctl", "restart", "--reason", "") == []  # free text: nothing to offer
    assert complete(source, "supervisorctl", "completion", "z") == ["zsh"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed here")
def test_zsh_accepts_its_script(capsys):
    source = script(capsys, "zsh")
    done = subprocess.run(["zsh", "-n"], input=source, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr


def test_the_zsh_script_is_the_bash_function_under_bashcompinit(capsys):
    source = script(capsys, "zsh")
    assert "bashcompinit" in source and "complete -F _supervisorctl supervisorctl" in source
    done = subprocess.run(["bash", "-n"], input=source.replace("autoload", ": autoload"), capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 0, done.stderr


def test_the_json_spec_names_every_command_and_its_flags(capsys):
    spec = json.loads(script(capsys, "bash", "--json"))
    assert set(spec["commands"]) == command_names()
    assert "--json" in spec["commands"]["goodput"]["flags"] and spec["commands"]["checkpoint"]["choices"] == ["now"]


def test_an_unknown_shell_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["completion", "fish"])
    assert exited.value.code == 2 and "invalid choice: 'fish'" in capsys.readouterr().err
