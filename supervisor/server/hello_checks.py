"""Bounds on what a Hello may carry, checked before anything else reads it.

A Hello's strings flow into the event log (NodeRegistered), every peer's directive (the buddy's
address), metrics labels and log lines, so each is bounded and given a form here, at the edge,
and a Hello outside them is refused PERMANENT with the reason (the agent exits 2: retrying the
same Hello cannot help). The node id's canonical form is common/node_id.py's, shared with the
agent's own flag check; the rest are this wire's: `host` is a host name or an IP literal as
peers will dial it, the version and failure domain short printable text.
"""

from __future__ import annotations

import ipaddress
import re

from ftsup.common.node_id import node_id_problem
from ftsup.v1 import agent_pb2

MAX_HOST_CHARS = 253  # a DNS name's limit
MAX_FAILURE_DOMAIN_CHARS = 128  # a rack or power domain's name
MAX_AGENT_VERSION_CHARS = 64  # a version string, e.g. 1.4.2+g3f0a94d
MAX_GPUS = 1024  # per node; more is a corrupt report
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_PRINTABLE = re.compile(r"[\x21-\x7e]*")  # ASCII without spaces or control characters


def hello_problem(hello: agent_pb2.Hello) -> str | None:
    """Why this Hello is refused before it is decided on, or None. Never echoes unbounded text."""
    problem = node_id_problem(hello.node_id)
    if problem is not None:
        return problem
    problem = host_problem(hello.host)
    if problem is not None:
        return f"node {hello.node_id!r}: {problem}"
    for name, value, limit in (("agent_version", hello.agent_version, MAX_AGENT_VERSION_CHARS),
                               ("failure_domain", hello.failure_domain, MAX_FAILURE_DOMAIN_CHARS)):
        if len(value) > limit:
            return f"node {hello.node_id!r}: {name} of {len(value)} characters is longer than {limit}"
        if not _PRINTABLE.fullmatch(value):
            return f"node {hello.node_id!r}: {name} {value!r} has spaces or control characters"
    if hello.gpus > MAX_GPUS:
        return f"node {hello.node_id!r}: {hello.gpus} GPUs is more than {MAX_GPUS}"
    return None


def host_problem(host: str) -> str | None:
    """Why `host` is not an address peers can dial (a host name or an IP literal), or None."""
    if not host:
        return "no host address given"
    if len(host) > MAX_HOST_CHARS:
        return f"host of {len(host)} characters is longer than {MAX_HOST_CHARS}"
    try:
        ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
        return None
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    if all(_LABEL.fullmatch(label) for label in labels):
        return None
    return f"host {host!r} is neither a host name nor an IP address"
