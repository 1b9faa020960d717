"""A token bucket: how many messages a sender may still send now, given its rate and burst.

Pure (time is an argument): the agent service keeps one per stream to close streams that flood
the supervisor's single input loop (issue 16, item 9).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    """`rate_per_s` tokens accrue per second up to `burst`; each message takes one."""

    rate_per_s: float
    burst: float
    tokens: float
    updated_s: float

    @classmethod
    def full(cls, rate_per_s: float, burst: float, now_s: float) -> TokenBucket:
        if not (rate_per_s > 0 and burst >= 1):
            raise ValueError(f"a token bucket needs rate_per_s > 0 and burst >= 1, got {rate_per_s}, {burst}")
        return cls(rate_per_s, burst, burst, now_s)

    def take(self, now_s: float) -> bool:
        """Takes one token; False when none is left (the sender is over its rate)."""
        elapsed_s = max(0.0, now_s - self.updated_s)
        self.tokens = min(self.burst, self.tokens + elapsed_s * self.rate_per_s)
        self.updated_s = now_s
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
