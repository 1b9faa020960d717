"""Whether a link shard's nodes are still reporting the newest step: how long a relay may hold a batch.

A shard's relay holds a batch open while a step's burst arrives (supervisor/shard.py `_linger`),
so the leader decides a step's reports in a few large folds instead of many small ones: its CPU
per node-step falls steeply with a fold's size (issue 14, part 16: ~390 us per fold on top of
~8 us per node at 12,500 nodes). "The queue grew in the last 5 ms" alone ends the wait at any
gap in the burst: a shard reading 4,000 streams, or a load generator stalling, leaves gaps, and
folds came out at 40-80 nodes. This remembers which sessions reported each of the last few steps:
while fewer have reported the newest step than the one before it, the burst is not over, and the
relay may go on waiting through a gap (up to shard.UP_BURST_S; a node that will not report, hung
or slow, costs each step that much latency and nothing else).

Steps are keyed by (generation, step) in the order they were first heard, not by value: a step
number far ahead (a buggy or hostile agent) becomes the newest for one step only, then the next
real step is newer than it.
"""

from __future__ import annotations

# Steps remembered (each a set of sessions: a shard's few thousand ints at most).
KEPT_STEPS = 4


class StepBurst:
    """The sessions that reported each of the last KEPT_STEPS steps, in the order first heard."""

    __slots__ = ("_reporters",)

    def __init__(self) -> None:
        self._reporters: dict[tuple[int, int], set[int]] = {}

    def note(self, session: int, generation: int, step: int) -> None:
        """`session` reported (part of) `step` of `generation`."""
        key = (generation, step)
        reporters = self._reporters.get(key)
        if reporters is None:
            reporters = self._reporters[key] = set()
            while len(self._reporters) > KEPT_STEPS:
                del self._reporters[next(iter(self._reporters))]
        reporters.add(session)

    @property
    def incomplete(self) -> bool:
        """Whether fewer sessions have reported the newest step than the step first heard before it
        in the same generation (a generation's first step: never; the queue's growth decides)."""
        if len(self._reporters) < 2:
            return False
        keys = list(self._reporters)
        newest = keys[-1]
        previous = next((key for key in reversed(keys[:-1]) if key[0] == newest[0]), None)
        return previous is not None and len(self._reporters[newest]) < len(self._reporters[previous])

    def clear(self) -> None:
        self._reporters.clear()
