"""Serves a rank's captured output (AgentPeer.TailLog) to the supervisor that relays it to an operator.

The launcher already appends each rank's stdout and stderr to `rank-R.gen-G.log` in the workdir;
this module only reads those files. The backlog is read from the file's end (at most
`TAIL_READ_BYTES`); a follow polls the file's size every `poll_s` and reads what was added, at
most `READ_BYTES` at a time, so memory per stream is bounded whatever the trainer writes: when it
writes faster than the reader drains, the gap is skipped and counted (`skipped_bytes`) rather
than buffered. A follow ends once the process writing the file has exited (and its last bytes
are sent) or the caller cancels; the file is closed on every way out. Line and message bounds:
agent/core/log_lines.py. At most `max_streams` tails run at once.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO

from ftsup.agent.core.log_lines import LineSplitter, batches, clamp_tail_lines, last_lines
from ftsup.agent.core.trainer_env import log_file_name
from ftsup.v1 import peer_pb2

TAIL_READ_BYTES = 4 * 1024 * 1024  # the backlog is found in at most this much of the file's end
READ_BYTES = 1024 * 1024  # one read of a follow; more unread than MAX_BEHIND_BYTES is skipped
MAX_BEHIND_BYTES = 8 * 1024 * 1024  # a follow this far behind the writer jumps to the end
POLL_S = 0.25  # how often a follow looks for new output
MAX_LOG_STREAMS = 8  # concurrent tails on one node: an operator or two, not a fleet
_LOG_NAME = re.compile(r"rank-(\d+)\.gen-(\d+)\.log")


class LogNotFound(LookupError):
    """This node holds no output of the rank (in that generation); the text says what was looked for."""


class TooManyTails(RuntimeError):
    """`max_streams` tails are running already."""


def _read_at(file: BinaryIO, offset: int, size: int) -> bytes:
    """Off the event loop (a large read must not delay the agent's heartbeats)."""
    file.seek(offset)
    return file.read(size)


def newest_generation(workdir: pathlib.Path, rank: int) -> int | None:
    """The highest generation this node kept a log of `rank` for, None when none."""
    found = [int(m.group(2)) for path in workdir.glob(f"rank-{rank}.gen-*.log")
             if (m := _LOG_NAME.fullmatch(path.name)) and int(m.group(1)) == rank]
    return max(found, default=None)


class LogTailer:
    def __init__(self, node_id: str, workdir: pathlib.Path, is_writing: Callable[[pathlib.Path], bool], *,
                 poll_s: float = POLL_S, max_streams: int = MAX_LOG_STREAMS) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self._node_id = node_id
        self._workdir = workdir
        self._is_writing = is_writing  # is a live trainer process still appending to this file?
        self._poll_s = poll_s
        self._max_streams = max_streams
        self.streams = 0  # tails in progress

    def resolve(self, request: peer_pb2.TailLogRequest) -> tuple[int, pathlib.Path]:
        """(generation, log file) a request names; LogNotFound when this node has none."""
        generation = request.generation or newest_generation(self._workdir, request.rank)
        if generation is None:
            raise LogNotFound(f"node {self._node_id} has no output of rank {request.rank}")
        path = self._workdir / log_file_name(request.rank, generation)
        if not path.is_file():
            raise LogNotFound(f"node {self._node_id} has no output of rank {request.rank} in generation {generation}")
        return generation, path

    async def tail(self, request: peer_pb2.TailLogRequest) -> AsyncIterator[peer_pb2.LogLines]:
        """The request's messages; raises LogNotFound or TooManyTails before the first one."""
        generation, path = self.resolve(request)
        if self.streams >= self._max_streams:
            raise TooManyTails(f"node {self._node_id} serves {self.streams} log streams already"
                               f" (at most {self._max_streams})")
        self.streams += 1
        try:
            def message(lines: list[str], *, ended: bool = False, skipped: int = 0) -> peer_pb2.LogLines:
                return peer_pb2.LogLines(node_id=self._node_id, rank=request.rank, generation=generation,
                                         lines=lines, ended=ended, skipped_bytes=skipped)

            with open(path, "rb") as file:
                offset = os.fstat(file.fileno()).st_size
                start = max(0, offset - TAIL_READ_BYTES)
                backlog = last_lines(await asyncio.to_thread(_read_at, file, start, offset - start),
                                     clamp_tail_lines(request.lines), is_file_start=start == 0)
                for batch in batches(backlog):
                    yield message(batch)
                if not request.follow:
                    return
                splitter = LineSplitter()
                while True:
                    is_last = not self._is_writing(path)  # decided before the read: its bytes are all there
                    size = os.fstat(file.fileno()).st_size
                    skipped = 0
                    if size < offset:  # truncated or rewritten: start over
                        offset = 0
                    if size - offset > MAX_BEHIND_BYTES:  # the first line after the gap may be a fragment
                        skipped, offset = size - offset - READ_BYTES, size - READ_BYTES
                        splitter = LineSplitter()
                    while offset < size:
                        data = await asyncio.to_thread(_read_at, file, offset, min(READ_BYTES, size - offset))
                        if not data:
                            break
                        offset += len(data)
                        for batch in batches(splitter.feed(data)):
                            yield message(batch, skipped=skipped)
                            skipped = 0
                    if skipped:
                        yield message([], skipped=skipped)
                    if is_last:
                        yield message(splitter.flush(), ended=True)
                        return
                    await asyncio.sleep(self._poll_s)
        finally:
            self.streams -= 1
