"""What a verifier's agent does for an SDC recompute order, as data: which orders to start or
stop, the replay process's request and environment, and what its answer file means.

Pure (stdlib only; the shell reads and writes the JSON). The orders are a projection of the
supervisor's open checks, sent in every directive: a check that disappears from it was answered
or timed out, and its replay stops. The request file and FTSUP_SDC_REPLAY are the contract with
trainer/replay.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

REPLAY_ENV = "FTSUP_SDC_REPLAY"  # trainer.replay.REPLAY_ENV
MAX_ERROR = 2000  # characters of an error sent to the supervisor (it refuses more than 4096)


@dataclass(frozen=True, slots=True)
class Reconcile:
    start: tuple[str, ...]  # ordered, neither running nor answered
    stop: tuple[str, ...]  # running or answered, no longer ordered


def reconcile(ordered: Iterable[str], running: Iterable[str], answered: Iterable[str]) -> Reconcile:
    """Idempotent by check id: a re-sent directive starts nothing twice."""
    wanted = list(dict.fromkeys(ordered))
    known = set(running) | set(answered)
    return Reconcile(tuple(c for c in wanted if c not in known), tuple(sorted(known - set(wanted))))


def request_body(check_id: str, step: int, rank: int, world_size: int, ranks: Sequence[int],
                 snapshot_path: str, sha256: str, out_path: str) -> dict[str, object]:
    """The request file's content (trainer.replay.ReplayRequest), to be written as JSON."""
    return {"check_id": check_id, "step": step, "rank": rank, "world_size": world_size,
            "ranks": list(ranks), "snapshot_path": snapshot_path, "sha256": sha256, "out_path": out_path}


def replay_env(base: Mapping[str, str], job_env: Iterable[tuple[str, str]], request_path: str) -> dict[str, str]:
    """The agent's environment, the job's variables, and the request: never a rank's launch
    variables (RANK, MASTER_ADDR...), so a replay cannot join the job's process group."""
    env = {**base, **dict(job_env)}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env[REPLAY_ENV] = request_path
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(frozen=True, slots=True)
class RankDigest:
    rank: int
    grad_digest: str
    param_digest: str


@dataclass(frozen=True, slots=True)
class Answer:
    recomputed: tuple[RankDigest, ...]
    error: str  # non-empty: nothing usable was recomputed
    replay_s: float = 0.0


def parse_answer(raw: object, check_id: str, asked: Sequence[int]) -> Answer:
    """The replay's answer file (decoded JSON), checked: the same check, exactly the asked ranks."""
    if not isinstance(raw, dict):
        return failed(f"unreadable replay answer: {type(raw).__name__}, not an object")
    try:
        if raw["check_id"] != check_id:
            return failed(f"the answer is for check {raw['check_id']!r}, not {check_id!r}")
        digests = tuple(RankDigest(int(d["rank"]), str(d["grad_digest"]), str(d.get("param_digest", "")))
                        for d in raw["recomputed"])
        replay_s = float(raw.get("replay_s", 0.0))
    except (ValueError, KeyError, TypeError) as exc:
        return failed(f"unreadable replay answer: {exc!r}")
    if sorted(d.rank for d in digests) != sorted(asked):
        return failed(f"the replay answered ranks {[d.rank for d in digests]}, asked {list(asked)}")
    if not all(d.grad_digest for d in digests):
        return failed("the replay computed no local-gradient digest")
    return Answer(digests, "", replay_s if math.isfinite(replay_s) and replay_s >= 0 else 0.0)


def failed(error: str) -> Answer:
    return Answer((), error[:MAX_ERROR])
