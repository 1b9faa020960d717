"""GrowOnly behaves as the tuple it replaces in PendingCheckpoint (equal, ordered, membership),
whichever views are appended to, and costs O(1) per append (supervisor/core/grow_only.py)."""

from __future__ import annotations

import random

import pytest

from ftsup.supervisor.core.grow_only import GrowOnly


def test_random_appends_to_any_view_match_the_tuples_they_stand_for() -> None:
    rng = random.Random(11)
    views: list[tuple[GrowOnly[int], tuple[int, ...]]] = [(GrowOnly(), ())]
    for _ in range(2_000):
        view, model = rng.choice(views) if rng.random() < 0.2 else views[-1]  # mostly the newest; some branches
        item = rng.randrange(50)
        grown = view.append(item)
        views.append((grown, (*model, item)))
        assert view == model, "appending changed the view it grew from"
    for view, model in views[:: 37]:
        assert view == model and tuple(view) == model and len(view) == len(model)
        assert hash(view) == hash(model)
        assert view[:3] == model[:3] and (not model or view[-1] == model[-1])
        for item in range(50):
            assert (item in view) == (item in model), (item, model)


def test_an_older_view_does_not_see_what_later_views_appended() -> None:
    empty: GrowOnly[int] = GrowOnly()
    one = empty.append(7)
    two = one.append(9)
    assert 9 not in one and 7 not in empty and 9 in two
    branch = one.append(5)  # one is not the newest: a copy, two unchanged
    assert branch == (7, 5) and two == (7, 9) and 5 not in two
    with pytest.raises(IndexError):
        one[1]


def test_views_compare_by_content_and_build_from_any_iterable() -> None:
    assert GrowOnly([1, 2]) == GrowOnly(iter([1, 2])) == (1, 2)
    assert GrowOnly([1, 2]) != (2, 1) and GrowOnly([1]) != [1]  # a list is not a tuple: unequal, as for tuples
    assert repr(GrowOnly([3])) == "GrowOnly((3,))"
