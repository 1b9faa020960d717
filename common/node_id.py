"""The canonical form of a node id, checked where an id enters: the agent's flags, the Hello.

A node id names a node in the event log, in metrics labels, in the agent's default work
directory (`/var/lib/ftsup/agent/<id>`) and in its certificate's SPIFFE ID
(`spiffe://ftsup/node/<id>`). So it must be one spelling per node and safe in each of those:
lowercase DNS-style, as Kubernetes node names are (RFC 1123: letters, digits, '-' and '.'),
1-63 characters, starting and ending with a letter or digit, no empty label (".", "..",
"a..b"). Uppercase is refused rather than folded: `Node-1` and `node-1` would otherwise be two
nodes to the supervisor and one to DNS and the certificate tooling.
"""

from __future__ import annotations

import re

MAX_NODE_ID_CHARS = 63
_NODE_ID = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?")
FORM = "1-63 of [a-z0-9.-], starting and ending with a letter or digit, no '..'"


def node_id_problem(node_id: str) -> str | None:
    """Why `node_id` is not a canonical node id, or None when it is."""
    if not node_id:
        return "a node id may not be empty"
    if len(node_id) > MAX_NODE_ID_CHARS:
        return f"node id of {len(node_id)} characters is longer than {MAX_NODE_ID_CHARS}"
    shown = repr(node_id)
    if not _NODE_ID.fullmatch(node_id) or ".." in node_id:
        hint = f" (lowercase: {node_id.lower()!r})" if _NODE_ID.fullmatch(node_id.lower()) else ""
        return f"node id {shown} is not canonical{hint}: use {FORM}"
    return None
