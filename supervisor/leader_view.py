"""What a leader knows about its etcd lease, and the pure rules that fold refresh answers into it
(shared by the keepalive thread, supervisor/lease_keeper.py, and the election, supervisor/leader.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LeaseView:
    """What we know about our lease: valid until `confirmed_at + ttl_s` unless revoked."""

    ttl_s: float
    confirmed_at: float  # monotonic time at which the last successful grant/refresh was sent
    is_revoked: bool = False


def after_keepalive(view: LeaseView, sent_at: float, granted_ttl_s: int | None) -> LeaseView:
    """Folds one refresh answer: None = the call failed (nothing learned); <= 0 = lease gone."""
    if granted_ttl_s is None:
        return view
    if granted_ttl_s <= 0:
        return dataclasses.replace(view, is_revoked=True)
    return dataclasses.replace(view, confirmed_at=max(view.confirmed_at, sent_at))


def leads_at(view: LeaseView, now: float) -> bool:
    return not view.is_revoked and now < view.confirmed_at + view.ttl_s


def next_refresh_in(view: LeaseView, *, failed: bool) -> float:
    """TTL/3 after a good refresh; quick retries after a failed one (one member down costs one call)."""
    return min(0.1, view.ttl_s / 20) if failed else view.ttl_s / 3


def is_loop_wedged(loop_seen_at: float, now: float, max_stall_s: float) -> bool:
    """Has the leader's event loop not run for longer than any stall it is forgiven (a generation
    start for 12,500 nodes: seconds)? Then the refreshing thread lets the lease lapse: a process
    whose loop is stuck for good must not hold leadership for as long as it lives."""
    return now - loop_seen_at > max_stall_s
