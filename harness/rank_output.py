"""Every rank's output, live, each line prefixed `[rank N]:` (torchrun's `--tee 3` look).

Owns following the agents' per-rank log files (`nodes/*/rank-R.gen-G.log` in a run directory) and
copying them on: to a stream, prefixed, and, with a log directory, into per-rank files there. A
partial last line waits for its newline (a rank's line is never split between two prefixes), and
is flushed when the run ends. Memory is bounded: at most `MAX_READ` bytes per file per poll and
one pending partial line of at most `MAX_LINE` bytes per file.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass, field
from typing import TextIO

MAX_READ = 1 << 20
MAX_LINE = 64 * 1024
_NAME = re.compile(r"^rank-(\d+)\.gen-(\d+)\.log$")


@dataclass(slots=True)
class _Followed:
    rank: int
    generation: int
    offset: int = 0
    pending: bytes = b""


@dataclass
class RankOutput:
    nodes_dir: pathlib.Path
    out: TextIO
    log_dir: pathlib.Path | None = None
    _files: dict[pathlib.Path, _Followed] = field(default_factory=dict)

    def poll(self) -> int:
        """Copies what the ranks wrote since the last poll; returns the number of lines shown."""
        shown = 0
        for path in sorted(self.nodes_dir.glob("*/rank-*.gen-*.log")):
            followed = self._files.get(path)
            if followed is None:
                match = _NAME.match(path.name)
                if match is None:
                    continue
                followed = self._files[path] = _Followed(int(match[1]), int(match[2]))
            shown += self._read(path, followed)
        self.out.flush()
        return shown

    def finish(self) -> None:
        """The run ended: the last poll, then every partial last line as it is."""
        self.poll()
        for followed in self._files.values():
            if followed.pending:
                self._emit(followed, [followed.pending])
                followed.pending = b""
        self.out.flush()

    def _read(self, path: pathlib.Path, followed: _Followed) -> int:
        try:
            with open(path, "rb") as log:
                log.seek(followed.offset)
                chunk = log.read(MAX_READ)
        except OSError:
            return 0
        if not chunk:
            return 0
        followed.offset += len(chunk)
        *lines, rest = (followed.pending + chunk).split(b"\n")
        if len(rest) > MAX_LINE:  # a line without end: shown in pieces rather than held forever
            lines.append(rest)
            rest = b""
        followed.pending = rest
        self._emit(followed, lines)
        return len(lines)

    def _emit(self, followed: _Followed, lines: list[bytes]) -> None:
        if not lines:
            return
        prefix = f"[rank {followed.rank}]:"
        text = [line.decode("utf-8", errors="replace") for line in lines]
        self.out.write("".join(f"{prefix}{line}\n" for line in text))
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            name = f"rank-{followed.rank}.gen-{followed.generation}.log"
            with open(self.log_dir / name, "a", encoding="utf-8") as copy:
                copy.write("".join(f"{line}\n" for line in text))
