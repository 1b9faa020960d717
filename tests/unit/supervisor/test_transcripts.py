"""The core's main recovery stories as transcripts (tests/unit/supervisor/transcripts/*.txt): input
lines and the events each must decide, in order (format: tests/support/transcript.py)."""

from __future__ import annotations

import pathlib

import pytest

from tests.support import transcript

STORIES = sorted((pathlib.Path(__file__).parent / "transcripts").glob("*.txt"))


def test_there_are_stories():
    assert len(STORIES) >= 4


@pytest.mark.parametrize("story", STORIES, ids=lambda p: p.stem)
def test_the_core_decides_what_the_story_says(story: pathlib.Path) -> None:
    mismatches = list(transcript.run(story))
    assert not mismatches, "\n".join(mismatches)


def test_a_story_whose_events_changed_fails_to_read(tmp_path: pathlib.Path) -> None:
    """The runner itself: a wrong expectation, a missing one and an unexpected refusal are caught."""
    base = (pathlib.Path(__file__).parent / "transcripts" / "operator_drain.txt").read_text()
    wrong = tmp_path / "wrong.txt"
    wrong.write_text(base.replace("> NodeDrained node_id=node-2", "> NodeDrained node_id=node-1"))
    assert list(transcript.run(wrong))
    missing = tmp_path / "missing.txt"
    missing.write_text(base.replace("> NodeDrained node_id=node-2\n", ""))
    assert list(transcript.run(missing))
    refused = tmp_path / "refused.txt"
    refused.write_text(base.replace("! unknown node 'node-9'", "> OperatorCommand command=drain"))
    assert list(transcript.run(refused))
