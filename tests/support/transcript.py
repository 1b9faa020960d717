"""Scenario transcripts for the pure core, read like raft's testdata: input lines, then the events
the core must decide for each, in order.

    # a comment
    config nodes=2 ranks=1 max_restarts=1      (once, first: the job and the detector)
    at 1003.5                                  (the clock for the inputs that follow)
    hello node-1 [spare]                       (AgentHello with defaults; streams numbered 1, 2, ... in
                                                the order of the hello lines)
    AgentHello node_id=node-1 role=spare ...   (any input dataclass, fields as key=value; an
                                                `output_tail` writes its spaces as `_`)
    > NodeRegistered node_id=node-1            (an event decided by the input above: its class,
                                                then only the fields worth pinning; `reason` and
                                                `detail` match a phrase, spaces written as `_`)
    !                                          (the input above decided nothing)
    ! unknown node                             (the input above was refused; the reason contains this)

Every input must be followed by its complete list of events (`>` lines, none, `!`), so a story
that starts deciding more or other events fails to read.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib
import types
import typing
from collections.abc import Iterator
from typing import Any

from ftsup.supervisor.core import inputs as inputs_module
from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.events import Event
from tests.support.builders import NOW, Sim, hello


@dataclasses.dataclass
class Step:
    line_no: int
    text: str
    input: inputs_module.Input
    at: float
    expected: list[tuple[int, str]]  # (line number, "> ..." or "! ..." line)


def _value(raw: str, hint: Any) -> Any:
    """A transcript token as the field's type: int, float, bool, str, enums by value, tuples of str."""
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and args:
        return _value(raw, args[0])
    if origin is tuple:
        return tuple(x for x in raw.split(",") if x)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(raw)
    if hint is bool:
        return raw in ("1", "true", "yes")
    if hint in (int, float):
        return hint(raw)
    return raw


def _fields(text: str) -> dict[str, str]:
    pairs = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {token!r}")
        pairs[key] = value
    return pairs


def _input(words: list[str], streams: int = 1) -> inputs_module.Input:
    if words[0] == "hello":
        return hello(words[1], spare="spare" in words[2:], stream_id=streams)
    cls = getattr(inputs_module, words[0], None)
    if cls is None or not dataclasses.is_dataclass(cls):
        raise ValueError(f"no input class {words[0]!r}")
    hints = typing.get_type_hints(cls)
    values = {k: _value(v, hints[k]) for k, v in _fields(" ".join(words[1:])).items()}
    if "output_tail" in values:  # a rank's output is prose: its spaces are written as `_`
        values["output_tail"] = values["output_tail"].replace("_", " ")
    return cls(**values)


def _config(words: list[str]) -> CoreConfig:
    opts = {k: v for k, v in (w.split("=", 1) for w in words[1:])}
    job = JobSpec(name="story", nodes=int(opts.get("nodes", 2)), ranks_per_node=int(opts.get("ranks", 1)),
                  argv=("train",), max_restarts=int(opts["max_restarts"]) if "max_restarts" in opts else None)
    detector = DetectorConfig(heartbeat_interval_s=1.0, heartbeat_misses=3, reconnect_grace_s=1.0)
    return CoreConfig(job=job, detector=detector, spare_grace_s=float(opts.get("spare_grace_s", 3.0)))


def parse(path: pathlib.Path) -> tuple[CoreConfig, list[Step]]:
    config: CoreConfig | None = None
    steps: list[Step] = []
    at = NOW
    for line_no, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith((">", "!")):
            if not steps:
                raise ValueError(f"{path.name}:{line_no}: an expectation before any input")
            steps[-1].expected.append((line_no, line))
            continue
        words = line.split()
        if words[0] == "config":
            config = _config(words)
        elif words[0] == "at":
            at = float(words[1])
        else:
            streams = 1 + sum(1 for s in steps if s.text.startswith("hello "))
            steps.append(Step(line_no, line, _input(words, streams), at, []))
    if config is None:
        raise ValueError(f"{path.name}: no config line")
    return config, steps


def _matches(event: Event, expected: str) -> bool:
    words = expected[1:].split()
    if type(event).__name__ != words[0]:
        return False
    for key, want in _fields(" ".join(words[1:])).items():
        got = getattr(event, key)
        got = got.value if isinstance(got, enum.Enum) else got
        if isinstance(got, (tuple, list)):
            got = ",".join(str(x) for x in got)
        # Prose fields match by a phrase in them, its spaces written as `_`.
        if str(got) != want and not (key in ("reason", "detail") and want.replace("_", " ") in str(got)):
            return False
    return True


def run(path: pathlib.Path) -> Iterator[str]:
    """Yields one message per mismatch (nothing when the story reads as written)."""
    config, steps = parse(path)
    sim = Sim(config, now=NOW)
    for step in steps:
        result = sim.feed(step.input, at=step.at)
        where = f"{path.name}:{step.line_no} `{step.text}`"
        if isinstance(result, str):
            want = [text for _, text in step.expected if text.startswith("!")]
            if not want or want[0][1:].strip() not in result:
                yield f"{where}: refused ({result}), expected {[t for _, t in step.expected]}"
            continue
        wanted = [(n, t) for n, t in step.expected if t.startswith(">")]
        if any(t.startswith("!") and t[1:].strip() for _, t in step.expected):
            yield f"{where}: expected a refusal, decided {[type(e).__name__ for e in result]}"
            continue
        if len(result) != len(wanted) or not all(_matches(e, t) for e, (_, t) in zip(result, wanted, strict=False)):
            got = "\n    ".join(repr(e) for e in result) or "(nothing)"
            yield f"{where}: decided\n    {got}\n  expected\n    " + "\n    ".join(t for _, t in wanted)
