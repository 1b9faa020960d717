"""The pure lease decision of supervisor/leader.py: when a leader must consider itself deposed."""

from __future__ import annotations

import math

from ftsup.supervisor.leader_view import LeaseView, after_keepalive, is_loop_wedged, leads_at, next_refresh_in

NOW = 1000.0


def granted_at(t: float) -> LeaseView:
    return LeaseView(ttl_s=2.0, confirmed_at=t)


def test_a_lease_is_trusted_until_one_ttl_after_the_last_good_refresh_was_sent() -> None:
    view = granted_at(NOW)
    assert leads_at(view, NOW + 1.99) and not leads_at(view, NOW + 2.0)


def test_a_failed_refresh_teaches_nothing_and_the_deadline_stands() -> None:
    view = after_keepalive(granted_at(NOW), sent_at=NOW + 0.7, granted_ttl_s=None)
    assert view == granted_at(NOW) and not leads_at(view, NOW + 2.0)


def test_a_good_refresh_extends_from_when_it_was_sent_not_answered() -> None:
    view = after_keepalive(granted_at(NOW), sent_at=NOW + 0.7, granted_ttl_s=2)
    assert leads_at(view, NOW + 2.69) and not leads_at(view, NOW + 2.7)


def test_a_late_answer_to_an_older_refresh_never_moves_the_deadline_back() -> None:
    view = after_keepalive(granted_at(NOW + 1.0), sent_at=NOW + 0.5, granted_ttl_s=2)
    assert view.confirmed_at == NOW + 1.0


def test_an_expired_lease_is_lost_at_once_and_for_good() -> None:
    view = after_keepalive(granted_at(NOW), sent_at=NOW + 0.1, granted_ttl_s=0)
    assert view.is_revoked and not leads_at(view, NOW + 0.2)
    assert not leads_at(after_keepalive(view, sent_at=NOW + 0.3, granted_ttl_s=2), NOW + 0.4)


def test_refreshes_run_at_a_third_of_the_ttl_and_retry_quickly_after_a_failure() -> None:
    assert next_refresh_in(granted_at(NOW), failed=False) == 2.0 / 3
    assert next_refresh_in(granted_at(NOW), failed=True) == 0.1
    assert not leads_at(LeaseView(2.0, -math.inf), NOW)


def test_a_loop_is_wedged_only_past_its_allowance_and_never_with_no_allowance() -> None:
    assert not is_loop_wedged(100.0, 130.0, 30.0)
    assert is_loop_wedged(100.0, 130.01, 30.0)
    assert not is_loop_wedged(100.0, 1e9, math.inf)
