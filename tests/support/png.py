"""A PNG written by a --plot command is whole: signature, a sized IHDR first, IEND last."""

from __future__ import annotations

import pathlib
import struct


def png_size(path: pathlib.Path) -> tuple[int, int]:
    """(width, height) of a complete PNG file; AssertionError naming what is wrong otherwise."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG (signature {data[:8]!r})"
    assert data[12:16] == b"IHDR", f"{path}: the first chunk is {data[12:16]!r}, not IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data[-8:-4] == b"IEND", f"{path} is cut short (no IEND chunk at the end)"
    assert width > 0 and height > 0
    return width, height
