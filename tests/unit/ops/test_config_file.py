"""TOML config files for both daemons: validation names the key, precedence is flags > env > file."""

from __future__ import annotations

import pathlib
import re

import pytest

from ftsup.agent.config import ConfigError as AgentConfigError
from ftsup.agent.config import build_parser as agent_parser
from ftsup.agent.config import parse_config
from ftsup.common.config_file import options
from ftsup.supervisor.config import ConfigError as SupervisorConfigError
from ftsup.supervisor.config import load as load_supervisor
from ftsup.supervisor.config import parser as supervisor_parser

ROOT = pathlib.Path(__file__).resolve().parents[3]
JOB = '{"name": "t", "nodes": 1, "argv": ["true"]}'


def write(tmp_path: pathlib.Path, name: str, text: str) -> pathlib.Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_agent_runs_from_a_file_alone_with_lists_for_comma_separated_flags(tmp_path: pathlib.Path) -> None:
    conf = write(tmp_path, "agent.toml", 'node_id = "n7"\nsupervisor = ["a:1", "b:2"]\ngpus = 4\n'
                                        f'workdir = "{tmp_path}"\nheartbeat_interval_s = 2\nlog_json = true\n')
    config = parse_config(["--config", str(conf)], environ={})
    assert config.node_id == "n7" and config.supervisors == ("a:1", "b:2")
    assert config.gpus == 4 and config.heartbeat_interval_s == 2.0 and config.log_json is True


def test_flags_beat_environment_which_beats_the_file_which_beats_defaults(tmp_path: pathlib.Path) -> None:
    conf = write(tmp_path, "agent.toml", 'node_id = "n1"\nsupervisor = "h:1"\ngpus = 1\nwarm_trainers = 1\n'
                                        'trainer_nice = 3\n')
    env = {"FTSUP_AGENT_GPUS": "2", "FTSUP_AGENT_WARM_TRAINERS": "2", "FTSUP_AGENT_ADDRESS": "unix:/x"}
    config = parse_config(["--config", str(conf), "--gpus", "3"], environ=env)
    assert config.gpus == 3  # flag
    assert config.warm_trainers == 2  # environment
    assert config.trainer_nice == 3  # file
    assert config.peer_port == 0  # default


def test_an_unknown_key_is_an_error_naming_the_key_and_the_file(tmp_path: pathlib.Path) -> None:
    conf = write(tmp_path, "agent.toml", 'node_id = "n1"\nsupervisor = "h:1"\nheartbeat_intervall_s = 1.0\n')
    with pytest.raises(AgentConfigError, match=rf"{re.escape(str(conf))}: unknown key 'heartbeat_intervall_s'"):
        parse_config(["--config", str(conf)], environ={})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("gpus = \"eight\"", "key 'gpus' must be an integer, got str 'eight'"),
        ("gpus = true", "key 'gpus' must be an integer, got bool True"),
        ("heartbeat_interval_s = \"1s\"", "key 'heartbeat_interval_s' must be a number"),
        ("log_json = \"yes\"", "key 'log_json' must be a boolean"),
        ("role = \"leader\"", "key 'role' must be one of ['active', 'spare'], got 'leader'"),
        ("host = 7", "key 'host' must be a string, got int 7"),
    ],
)
def test_a_wrong_type_is_an_error_naming_the_key(tmp_path: pathlib.Path, line: str, message: str) -> None:
    conf = write(tmp_path, "agent.toml", f'node_id = "n1"\nsupervisor = "h:1"\n{line}\n')
    with pytest.raises(AgentConfigError, match=re.escape(message)):
        parse_config(["--config", str(conf)], environ={})


def test_file_values_still_pass_the_daemons_own_validation(tmp_path: pathlib.Path) -> None:
    conf = write(tmp_path, "agent.toml", 'node_id = "n1"\nsupervisor = "h:1"\ntrainer_nice = 40\n')
    with pytest.raises(AgentConfigError, match="--trainer-nice: 40 must be within 0..19"):
        parse_config(["--config", str(conf)], environ={})


def test_bad_environment_values_and_unknown_variables_are_named(tmp_path: pathlib.Path) -> None:
    base = ["--node-id", "n1", "--supervisor", "h:1"]
    with pytest.raises(AgentConfigError, match="FTSUP_AGENT_GPUS must be an integer, got 'many'"):
        parse_config(base, environ={"FTSUP_AGENT_GPUS": "many"})
    with pytest.raises(AgentConfigError, match="FTSUP_AGENT_GPU: 'gpu' is not an option"):
        parse_config(base, environ={"FTSUP_AGENT_GPU": "1"})
    assert parse_config(base + ["--gpus", "0"], environ={"FTSUP_AGENT_LOG_JSON": "false"}).log_json is False


def test_invalid_toml_and_a_missing_file_are_reported_with_the_path(tmp_path: pathlib.Path) -> None:
    broken = write(tmp_path, "agent.toml", "node_id = \n")
    with pytest.raises(AgentConfigError, match=f"config file {re.escape(str(broken))} is not valid TOML"):
        parse_config(["--config", str(broken)], environ={})
    with pytest.raises(AgentConfigError, match="cannot read config file .*missing.toml"):
        parse_config(["--config", str(tmp_path / "missing.toml")], environ={})


def test_the_supervisor_reads_its_file_and_environment(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = write(tmp_path, "job.json", JOB)
    conf = write(tmp_path, "supervisor.toml", f'job = "{job}"\ntick_s = 0.5\nallowed_nodes = ["a", "b"]\n'
                                              f'data_dir = "{tmp_path / "log"}"\n')
    monkeypatch.setenv("FTSUP_SUPERVISOR_TICK_S", "0.25")
    config = load_supervisor(["--config", str(conf)])
    assert config.tick_s == 0.25 and config.core.allowed_nodes == frozenset({"a", "b"})
    assert config.data_dir == tmp_path / "log" and config.core.job.name == "t"
    monkeypatch.setenv("FTSUP_SUPERVISOR_SEGMENT_MIB", "0")
    with pytest.raises(SupervisorConfigError, match=r"--segment-mib must be within \[1, 4096\], got 0"):
        load_supervisor(["--config", str(conf)])


def test_the_supervisor_names_a_bad_key_and_file(tmp_path: pathlib.Path) -> None:
    conf = write(tmp_path, "supervisor.toml", 'job = "j.json"\nlisten = 7070\n')
    with pytest.raises(SupervisorConfigError, match=rf"{re.escape(str(conf))}: key 'listen' must be a string"):
        load_supervisor(["--config", str(conf)])


def uncommented(example: pathlib.Path) -> str:
    """The example with every `# key = value` line switched on, to load what it documents."""
    return re.sub(r"^# ([a-z_]+ = )", r"\1", example.read_text(), flags=re.MULTILINE)


@pytest.mark.parametrize(("example", "make_parser"), [("supervisor.toml", supervisor_parser), ("agent.toml", agent_parser)])
def test_the_example_file_documents_every_option_with_a_valid_value(example: str, make_parser) -> None:  # type: ignore[no-untyped-def]
    import tomllib

    from ftsup.common.config_file import from_toml_value

    path = ROOT / "systemd" / example
    documented = tomllib.loads(uncommented(path))
    known = options(make_parser())
    missing = sorted(set(known) - set(documented))
    assert not missing, f"{path} does not document {missing}"
    assert not set(documented) - set(known), f"{path} documents options that do not exist"
    for key, value in documented.items():
        from_toml_value(known[key], value)  # raises, naming the key's problem, when the example is wrong
        text = path.read_text()
        comment_above = text[: text.index(f"{key} = ")].rstrip("# ").splitlines()[-1]
        assert comment_above.startswith("#") and len(comment_above) > 8, f"{key} has no comment above it in {path}"
