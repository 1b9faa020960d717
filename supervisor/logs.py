"""Structured logging set-up for every ftsup process (supervisor, agent, harness).

JSON lines when the output is not a terminal (production, systemd's journal), readable key=value
lines on a terminal. Loggers bind `node_id` / `generation` where they know them, so every line about
a node carries them.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure(*, json: bool | None = None, level: str = "info", stream: TextIO | None = None) -> None:
    """Sets up structlog once per process; `json=None` picks JSON unless writing to a terminal."""
    out = stream if stream is not None else sys.stderr
    as_json = (not out.isatty()) if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
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
