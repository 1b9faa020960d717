"""PNG plots for the command line (`ftsup sim --plot`, `ftsup bench scale --plot`,
`supervisorctl goodput --plot`): the one place matplotlib is loaded.

matplotlib is optional (the `plot` extra): nothing imports it until a plot is drawn, and a missing
install is a clear error naming the extra. The target path is checked before any work starts, so a
long simulation or benchmark never ends in "cannot write". The Agg backend draws without a display.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

EXTRA_HINT = "pip install 'ftsup[plot]' (matplotlib)"
# Colours by meaning, shared by every plot: productive green, losses warm, waiting grey.
BUCKET_COLOURS = {
    "productive": "#4caf50", "checkpoint_pauses": "#90caf9", "snapshot_pauses": "#64b5f6",
    "detection": "#ffb300", "restart": "#fb8c00", "lost_work": "#e53935", "waiting": "#9e9e9e",
}


class PlotUnavailable(Exception):
    """matplotlib is not installed: the message says which extra brings it."""


def check_target(path: str) -> pathlib.Path:
    """The PNG to write: ends in .png, its folder exists and is writable (ValueError otherwise)."""
    target = pathlib.Path(path)
    if target.suffix.lower() != ".png":
        raise ValueError(f"--plot {path!r}: the plot is a PNG; name a file ending in .png")
    folder = target.parent if str(target.parent) else pathlib.Path(".")
    if not folder.is_dir():
        raise ValueError(f"--plot {path!r}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--plot {path!r}: folder {str(folder)!r} is not writable")
    return target


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or PlotUnavailable naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(f"--plot needs matplotlib, which is not installed: {EXTRA_HINT}") from exc
    return plt


def save(figure: Any, target: str | os.PathLike[str]) -> None:
    """Writes the figure next to its final name and renames it: a reader never sees half a PNG."""
    plt = pyplot()
    target = pathlib.Path(target)
    partial = target.with_name(f".{target.name}.partial")
    try:
        figure.savefig(partial, format="png", dpi=110, bbox_inches="tight")
        os.replace(partial, target)
    finally:
        plt.close(figure)
        partial.unlink(missing_ok=True)
