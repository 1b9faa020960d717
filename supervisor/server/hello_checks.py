"""Bounds on what a Hello may carry, checked before anything else reads it.

A Hello's strings flow into the event log (NodeRegistered), every peer's directive (the buddy's
address), metrics labels and log lines, so each is bounded and given a form here, at the edge,
and a Hello outside them is refused PERMANENT with the reason (the agent exits 3: retrying the
same Hello cannot help). The node id's canonical form is common/node_id.py's, shared with the
agent's own flag check, and the other fields' bounds are common/hello_fields.py's (the agent
checks its --host and --failure-domain against them too): `host` a host name or an IP literal as
peers will dial it, the version and failure domain short printable text.
"""

from __future__ import annotations

from ftsup.common.hello_fields import (
    MAX_AGENT_VERSION_CHARS,
    MAX_FAILURE_DOMAIN_CHARS,
    MAX_HOST_CHARS,
    host_problem,
    text_problem,
)
from ftsup.common.node_id import node_id_problem
from ftsup.v1 import agent_pb2

__all__ = ["MAX_GPUS", "MAX_HOST_CHARS", "hello_problem"]

MAX_GPUS = 1024  # per node; more is a corrupt report


def hello_problem(hello: agent_pb2.Hello) -> str | None:
    """Why this Hello is refused before it is decided on, or None. Never echoes unbounded text."""
    problem = node_id_problem(hello.node_id)
    if problem is not None:
        return problem
    problem = (host_problem(hello.host)
               or text_problem("agent_version", hello.agent_version, MAX_AGENT_VERSION_CHARS)
               or text_problem("failure_domain", hello.failure_domain, MAX_FAILURE_DOMAIN_CHARS))
    if problem is not None:
        return f"node {hello.node_id!r}: {problem}"
    if hello.gpus > MAX_GPUS:
        return f"node {hello.node_id!r}: {hello.gpus} GPUs is more than {MAX_GPUS}"
    return None
