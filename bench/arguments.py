"""What the benches' command lines share: sizes given as one comma-separated flag (`--nodes
1250,12500`) and the work directory each run makes under `--dir`."""

from __future__ import annotations

import argparse
import pathlib
import tempfile
from collections.abc import Callable


def int_list(low: int, high: int) -> Callable[[str], list[int]]:
    """An argparse `type`: at least one integer, comma-separated, each within [low, high]; anything
    else is argparse's usage error naming the flag (the benches run one case per value)."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
        if not values or min(values) < low or max(values) > high:
            raise argparse.ArgumentTypeError(f"{text!r}: give at least one value, each within [{low}, {high}]")
        return values

    return parse


def run_directory(prefix: str, parent: str | pathlib.Path | None) -> pathlib.Path:
    """A fresh directory for one run under `--dir` (the system's temp dir without one), `--dir`
    made first if it does not exist: a long bench should not die on a path the user meant to create."""
    if parent is not None:
        pathlib.Path(parent).mkdir(parents=True, exist_ok=True)
    return pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
