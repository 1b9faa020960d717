"""Bounds on the free-text fields an agent announces in its Hello, shared by both ends.

The supervisor refuses a Hello outside them (supervisor/server/hello_checks.py); the agent checks
its own flags against the same bounds at start, so a bad `--host` or `--failure-domain` is a
configuration error (exit 2) on the node, not a permanent refusal after it connected.
"""

from __future__ import annotations

import ipaddress
import re

MAX_HOST_CHARS = 253  # a DNS name's limit
MAX_FAILURE_DOMAIN_CHARS = 128  # a rack or power domain's name
MAX_AGENT_VERSION_CHARS = 64  # a version string, e.g. 1.4.2+g3f0a94d
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_PRINTABLE = re.compile(r"[\x21-\x7e]*")  # ASCII without spaces or control characters


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
    if all(_LABEL.fullmatch(label) for label in host.removesuffix(".").split(".")):
        return None
    return f"host {host!r} is neither a host name nor an IP address"


def text_problem(name: str, value: str, limit: int) -> str | None:
    """Why a short label (`agent_version`, `failure_domain`) is refused, or None."""
    if len(value) > limit:
        return f"{name} of {len(value)} characters is longer than {limit}"
    if not _PRINTABLE.fullmatch(value):
        return f"{name} {value!r} has spaces or control characters"
    return None
