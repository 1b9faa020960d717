"""Every variable in systemd/*.env.example is one the daemon reads (issue 16, item 11): a name the
daemon ignores would look configured and silently not be."""

from __future__ import annotations

import pathlib

import pytest

from ftsup.agent import config as agent_config
from ftsup.common.config_file import load_env, options
from ftsup.supervisor import config as supervisor_config

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = {
    "agent.env.example": (agent_config.ENV_PREFIX, agent_config.build_parser),
    "supervisor.env.example": (supervisor_config.ENV_PREFIX, supervisor_config.parser),
}


def variables(path: pathlib.Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_name_in_the_env_example_is_an_option_the_daemon_reads(name: str) -> None:
    prefix, make_parser = EXAMPLES[name]
    env = variables(ROOT / "systemd" / name)
    assert env, f"{name} sets nothing"
    ignored = [n for n in env if not n.startswith(prefix)]
    assert not ignored, f"{name}: {ignored} do not start with {prefix}: the daemon never reads them"
    read = load_env(env, prefix, options(make_parser()))  # raises on a name that is no option
    assert len(read) == len(env)


def test_the_agent_example_configures_an_agent() -> None:
    env = variables(ROOT / "systemd" / "agent.env.example")
    # TLS comes from agent.toml in the shipped setup; here --insecure stands in for it.
    config = agent_config.parse_config(["--workdir", "/tmp/ftsup-env-example-unused", "--insecure"], environ=env)
    assert config.node_id == env["FTSUP_AGENT_NODE_ID"] and config.peer_port == int(env["FTSUP_AGENT_PEER_PORT"])
