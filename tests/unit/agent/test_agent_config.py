"""Command-line validation: bad values are rejected naming the flag and the limit."""

from __future__ import annotations

import pytest

from ftsup.agent.config import ConfigError, parse_config
from ftsup.agent.main import main

BASE = ["--node-id", "node-1", "--supervisor", "h1:50051,h2:50052"]


def test_defaults_fill_the_frozen_config():
    config = parse_config(BASE + ["--gpus", "8"])
    assert config.supervisors == ("h1:50051", "h2:50052")
    assert config.role == "active" and config.host == "127.0.0.1" and config.peer_port == 0
    assert str(config.workdir) == "/var/lib/ftsup/agent/node-1"
    assert config.trainer_link_address == "unix:/var/lib/ftsup/agent/node-1/agent.sock"
    assert config.heartbeat_interval_s == 1.0 and config.gpus == 8


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--heartbeat-interval-s", "nan"], "heartbeat-interval-s"),
        (["--heartbeat-interval-s", "0"], "heartbeat-interval-s"),
        (["--heartbeat-interval-s", "61"], "<= 60"),
        (["--peer-port", "70000"], "peer-port"),
        (["--gpus", "-1"], "gpus"),
    ],
)
def test_bad_values_are_rejected_with_the_flag_named(extra, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(BASE + extra)


@pytest.mark.parametrize("node_id", ["", "has space", "x" * 65, "a/b"])
def test_bad_node_ids_are_rejected(node_id):
    with pytest.raises(ConfigError, match="node-id"):
        parse_config(["--node-id", node_id, "--supervisor", "h:1"])


@pytest.mark.parametrize("supervisor", ["nohost", "h:0", "h:x", ":80", ","])
def test_bad_supervisor_addresses_are_rejected(supervisor):
    with pytest.raises(ConfigError, match="supervisor"):
        parse_config(["--node-id", "n", "--supervisor", supervisor])


def test_main_exits_2_with_a_clear_message_on_bad_flags(capsys):
    assert main(["--node-id", "bad id", "--supervisor", "h:1"]) == 2
    assert "--node-id" in capsys.readouterr().err
