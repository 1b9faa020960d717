"""The core's typed errors, in one place so every folding module raises the same one."""

from __future__ import annotations


class InvalidEvent(ValueError):
    """The event cannot be applied to this state; the message says which rule it breaks."""
