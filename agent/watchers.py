"""Background watchers of the node: hung ranks and NVIDIA Xid errors in the kernel log.

Each watcher turns what it sees into a report for the supervisor; the verdicts (restart,
quarantine) are the supervisor's. Kernel-log sources: /dev/kmsg (pollable, read from its end),
or any text file followed like `tail -F` (a syslog file, or a file tests and chaos append to).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping

import structlog

from ftsup.agent.core.hang import HangConfig, check_hang
from ftsup.agent.core.xid import XidRecord, normalize_pci, parse_xid_line
from ftsup.agent.progress import ProgressTracker
from ftsup.v1 import agent_pb2

Logger = structlog.typing.FilteringBoundLogger
Report = Callable[[agent_pb2.AgentMessage], None]


async def watch_hangs(
    tracker: ProgressTracker,
    running: Callable[[], tuple[int, tuple[int, ...], set[int]]],
    report: Report,
    config: HangConfig,
    log: Logger,
    period_s: float = 1.0,
) -> None:
    """`running()` gives (generation, its ranks on this node, the ranks whose process is alive)."""
    while True:
        await asyncio.sleep(period_s)
        generation, ranks, live = running()
        if generation != tracker.generation:
            tracker.start_generation(generation, ranks)  # a new generation's clock starts now
        now = tracker.now()
        for rank, progress in tracker.ranks.items():
            if rank not in live or progress.is_hang_reported or not progress.is_watched:
                continue
            hang = check_hang(list(progress.step_times_s), progress.last_progress_s, now, config, progress.phase)
            if hang is None:
                continue
            progress.is_hang_reported = True
            log.warning("trainer_hung", generation=tracker.generation, rank=rank, last_step=progress.last_step,
                        silent_for_s=round(hang.silent_for_s, 1), limit_s=round(hang.limit_s, 1),
                        phase=hang.phase or None)
            report(agent_pb2.AgentMessage(trainer_hung=agent_pb2.TrainerHung(
                generation=tracker.generation, rank=rank, last_step=progress.last_step,
                silent_for_s=hang.silent_for_s, limit_s=hang.limit_s)))


def gpu_index_by_pci() -> dict[str, int]:
    """PCI bus id -> GPU index from nvidia-smi, or empty when there is none (no GPU, no driver)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    mapping = {}
    for line in out.splitlines():
        index, _, pci = line.partition(",")
        if index.strip().isdigit():
            mapping[normalize_pci(pci.strip())] = int(index)
    return mapping


def follow_file(path: pathlib.Path, poll_s: float = 0.2) -> AsyncIterator[str]:
    """Lines appended to `path` from this call on; survives rotation and truncation (like tail -F).

    "From this call on", not from the first iteration: the file's end is noted here, so a line
    written between starting the watcher and its task's first turn (a busy loop) is not skipped
    as old."""
    try:
        stat = path.stat()
        start = (stat.st_ino, stat.st_size)  # its old lines predate us; a file made later is all new
    except FileNotFoundError:
        start = None
    return _follow_file(path, poll_s, start)


async def _follow_file(path: pathlib.Path, poll_s: float, start: tuple[int, int] | None) -> AsyncIterator[str]:
    handle = None
    inode = None
    position = 0
    pending = b""
    while True:
        try:
            stat = path.stat()
        except FileNotFoundError:
            stat = None
        if stat is not None and (handle is None or stat.st_ino != inode or stat.st_size < position):
            if handle is not None:
                # Rotated or truncated: whatever was appended to the old file before the switch
                # still counts (an Xid written just before a logrotate must not be missed).
                pending += handle.read() if stat.st_ino != inode else b""
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
                handle.close()
            first_open = inode is None
            handle = open(path, "rb")  # noqa: SIM115 (kept open across polls; closed on rotation and exit)
            inode = stat.st_ino
            position = start[1] if first_open and start is not None and start[0] == inode else 0
            handle.seek(position)
            pending = b""
        if handle is not None:
            chunk = handle.read()
            if chunk:
                position += len(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
                continue
        await asyncio.sleep(poll_s)


async def follow_kmsg(path: pathlib.Path = pathlib.Path("/dev/kmsg")) -> AsyncIterator[str]:
    """Kernel messages from now on, from /dev/kmsg ("pri,seq,usec,flags;text" records)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    os.lseek(fd, 0, os.SEEK_END)
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    try:
        while True:
            await readable.wait()
            readable.clear()
            while True:
                try:
                    record = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError:  # EPIPE: records were overwritten before we read them; go on
                    continue
                _, _, text = record.decode(errors="replace").partition(";")
                yield text.split("\n", 1)[0]
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def xid_event(record: XidRecord, source: str) -> agent_pb2.AgentMessage:
    event = agent_pb2.XidEvent(pci=record.pci, code=record.code, process=record.process or "",
                               message=record.message, source=source)
    if record.gpu is not None:
        event.gpu = record.gpu
    if record.pid is not None:
        event.pid = record.pid
    return agent_pb2.AgentMessage(xid_event=event)


async def watch_xids(
    lines: AsyncIterator[str], source: str, gpus: Mapping[str, int], report: Report, log: Logger
) -> None:
    async for line in lines:
        record = parse_xid_line(line, gpus)
        if record is None:
            continue
        log.warning("xid", code=record.code, pci=record.pci, gpu=record.gpu, message=record.message, source=source)
        report(xid_event(record, source))
