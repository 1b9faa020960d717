"""Structured logging set-up for every ftsup process (supervisor, agent, harness).

JSON lines when the output is not a terminal (production, systemd's journal), readable key=value
lines on a terminal. Every line about a node carries `node_id` and `generation` (null when none is
in force): the supervisor passes the generation in force, the agent binds its own node id and a
`Live` generation read when each line is written. `tests/integration/test_log_context.py` checks
every line of a real cluster run for them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog


class Live:
    """A bound value read when a line is written, not when it is bound (e.g. the generation an
    agent runs now, which changes under a logger bound once at start-up)."""

    __slots__ = ("read",)

    def __init__(self, read: Callable[[], object]) -> None:
        self.read = read

    def __repr__(self) -> str:  # renderers that never ran `resolve_live` still show the value
        return repr(self.read())


def resolve_live(_logger: object, _name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replaces each `Live` value with what it reads now."""
    for key, value in event_dict.items():
        if isinstance(value, Live):
            event_dict[key] = value.read()
    return event_dict


class _CurrentStderr:
    """`sys.stderr` as it is at each write, not as it was when logging was configured: a caller
    that swaps it (pytest's capture, a bench run in-process) must not leave every later log line
    writing into a stream that was closed meanwhile."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure(*, json: bool | None = None, level: str = "info", stream: TextIO | None = None) -> None:
    """Sets up structlog once per process; `json=None` picks JSON unless writing to a terminal.
    Without `stream`, lines go to whatever `sys.stderr` is when each is written."""
    out: Any = stream if stream is not None else _CurrentStderr()
    as_json = (not out.isatty()) if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            resolve_live,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=True,
    )


def get(name: str, **bound: object) -> structlog.typing.FilteringBoundLogger:
    """A lazy logger: safe to create at import time, before `configure` runs."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(component=name, **bound)
    return logger
