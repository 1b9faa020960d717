"""A rank's output cut into bounded lines and messages, for `supervisorctl logs` (AgentPeer.TailLog).

Pure: the shell (agent/log_tail.py) reads the file and hands the bytes here. The bounds are what
keep a chatty or binary-spewing trainer from pinning memory anywhere on the relay path: a line is
cut at `MAX_LINE_BYTES` (a partial line is held at most that long), a message carries at most
`MAX_LINES_PER_MESSAGE` lines, and the backlog sent first is at most `MAX_TAIL_LINES` lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

MAX_LINE_BYTES = 16 * 1024  # a longer line is sent in pieces of this size
MAX_LINES_PER_MESSAGE = 256  # with MAX_LINE_BYTES: a message stays within 4 MiB, gRPC's default limit
MAX_TAIL_LINES = 10_000  # the most lines a request may ask for first
DEFAULT_TAIL_LINES = 100


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class LineSplitter:
    """Bytes in, complete lines out; holds at most `max_line_bytes` of an unfinished line."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
        self._max = max_line_bytes
        self._partial = b""

    def feed(self, data: bytes) -> list[str]:
        """The lines `data` completes (a line longer than the bound comes out in pieces)."""
        buffered = self._partial + data
        *complete, self._partial = buffered.split(b"\n")
        lines: list[str] = []
        for line in complete:
            lines.extend(_pieces(line.removesuffix(b"\r"), self._max))
        while len(self._partial) >= self._max:
            lines.append(_decode(self._partial[: self._max]))
            self._partial = self._partial[self._max:]
        return lines

    def flush(self) -> list[str]:
        """The unfinished line, if any (the writer ended without a newline)."""
        rest, self._partial = self._partial, b""
        return [_decode(rest)] if rest else []


def _pieces(line: bytes, max_bytes: int) -> Iterator[str]:
    if not line:
        yield ""
        return
    for start in range(0, len(line), max_bytes):
        yield _decode(line[start:start + max_bytes])


def last_lines(data: bytes, count: int, *, is_file_start: bool = True,
               max_line_bytes: int = MAX_LINE_BYTES) -> list[str]:
    """The last `count` lines of `data`, the end of a file; when `data` is not the file's start its
    first line may be a fragment and is dropped."""
    if count <= 0 or not data:
        return []
    if not is_file_start:
        newline = data.find(b"\n")
        data = data[newline + 1:] if newline >= 0 else b""
    splitter = LineSplitter(max_line_bytes)
    lines = splitter.feed(data) + splitter.flush()
    return lines[-count:]


def batches(lines: Iterable[str], max_lines: int = MAX_LINES_PER_MESSAGE) -> Iterator[list[str]]:
    """`lines` in groups of at most `max_lines` (none for no lines)."""
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) == max_lines:
            yield batch
            batch = []
    if batch:
        yield batch


def clamp_tail_lines(requested: int | None) -> int:
    """How many backlog lines to send for a request: None is the default; never more than the cap."""
    if requested is None:
        return DEFAULT_TAIL_LINES
    return max(0, min(requested, MAX_TAIL_LINES))
