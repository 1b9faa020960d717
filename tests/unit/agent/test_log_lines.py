"""Bounded lines and messages for `supervisorctl logs`, and the agent's file tail on a real file."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from ftsup.agent.core.log_lines import MAX_TAIL_LINES, LineSplitter, batches, clamp_tail_lines, last_lines
from ftsup.agent.log_tail import LogNotFound, LogTailer, TooManyTails, newest_generation
from ftsup.v1 import peer_pb2


def test_a_split_line_comes_out_once_its_newline_arrives() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"hel") == []
    assert splitter.feed(b"lo\r\nwor") == ["hello"]
    assert splitter.feed(b"ld\n\n") == ["world", ""]
    assert splitter.flush() == []


def test_a_line_longer_than_the_bound_comes_out_in_pieces_and_nothing_longer_is_held() -> None:
    splitter = LineSplitter(max_line_bytes=4)
    assert splitter.feed(b"abcdefghij") == ["abcd", "efgh"]
    assert splitter.flush() == ["ij"]
    assert LineSplitter(max_line_bytes=4).feed(b"abcdefghi\n") == ["abcd", "efgh", "i"]


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    assert LineSplitter().feed(b"\xff\xfeok\n") == ["\ufffd\ufffdok"]


def test_the_backlog_is_the_last_lines_and_a_fragment_at_the_read_start_is_dropped() -> None:
    data = b"a\nb\nc\nd"
    assert last_lines(data, 2) == ["c", "d"]
    assert last_lines(data, 0) == []
    assert last_lines(b"ragment\nx\ny\n", 5, is_file_start=False) == ["x", "y"]


def test_messages_hold_at_most_the_cap_and_requests_are_clamped() -> None:
    assert [len(b) for b in batches(map(str, range(600)), 256)] == [256, 256, 88]
    assert list(batches([], 256)) == []
    assert clamp_tail_lines(None) == 100 and clamp_tail_lines(0) == 0
    assert clamp_tail_lines(10**9) == MAX_TAIL_LINES


def _log(workdir: pathlib.Path, rank: int, generation: int, text: bytes) -> pathlib.Path:
    path = workdir / f"rank-{rank}.gen-{generation}.log"
    path.write_bytes(text)
    return path


async def _collect(tailer: LogTailer, request: peer_pb2.TailLogRequest) -> list[peer_pb2.LogLines]:
    return [m async for m in tailer.tail(request)]


def test_the_newest_generation_is_found_and_a_missing_log_is_named(tmp_path: pathlib.Path) -> None:
    _log(tmp_path, 1, 2, b"old\n")
    _log(tmp_path, 1, 10, b"new\n")
    _log(tmp_path, 11, 12, b"other rank\n")
    assert newest_generation(tmp_path, 1) == 10
    tailer = LogTailer("n1", tmp_path, lambda _path: False)
    messages = asyncio.run(_collect(tailer, peer_pb2.TailLogRequest(rank=1, lines=5)))
    assert [(m.generation, list(m.lines)) for m in messages] == [(10, ["new"])]
    with pytest.raises(LogNotFound, match="rank 3"):
        asyncio.run(_collect(tailer, peer_pb2.TailLogRequest(rank=3)))


def test_a_follow_sends_what_is_appended_and_ends_with_the_writer(tmp_path: pathlib.Path) -> None:
    path = _log(tmp_path, 0, 1, b"first\n")
    writing = {"alive": True}
    tailer = LogTailer("n1", tmp_path, lambda p: p == path and writing["alive"], poll_s=0.01)

    async def scenario() -> list[peer_pb2.LogLines]:
        seen: list[peer_pb2.LogLines] = []
        async for message in tailer.tail(peer_pb2.TailLogRequest(rank=0, generation=1, lines=10, follow=True)):
            seen.append(message)
            if list(message.lines) == ["first"]:
                with open(path, "ab") as log:
                    log.write(b"second\nno newline at the end")
                writing["alive"] = False
        return seen

    seen = asyncio.run(scenario())
    assert [line for m in seen for line in m.lines] == ["first", "second", "no newline at the end"]
    assert seen[-1].ended and tailer.streams == 0


def test_a_cancelled_follow_releases_its_slot_and_the_cap_refuses_beyond_it(tmp_path: pathlib.Path) -> None:
    _log(tmp_path, 0, 1, b"line\n")
    tailer = LogTailer("n1", tmp_path, lambda _p: True, poll_s=0.01, max_streams=1)

    async def scenario() -> None:
        follow = tailer.tail(peer_pb2.TailLogRequest(rank=0, generation=1, lines=1, follow=True))
        assert list((await anext(follow)).lines) == ["line"]
        assert tailer.streams == 1
        with pytest.raises(TooManyTails):
            await anext(tailer.tail(peer_pb2.TailLogRequest(rank=0, generation=1)))
        task = asyncio.create_task(anext(follow))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await follow.aclose()
        assert tailer.streams == 0

    asyncio.run(scenario())
