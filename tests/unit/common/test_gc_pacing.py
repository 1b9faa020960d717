"""A full collection's survivors are frozen out of the next (the real collector), its pauses are
reported from the loop, and the frozen heap is thawed and collected every `refreeze_s`."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from ftsup.common.gc_pacing import GcPacer
from tests.support.async_wait import eventually


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_what_survives_a_full_collection_is_frozen_and_a_garbage_cycle_waits_for_the_thaw(thawed: None) -> None:
    now, pauses = [0.0], []
    pacer = GcPacer(refreeze_s=600.0, clock=lambda: now[0], on_pause=lambda g, s: pauses.append((g, s)))
    pacer.install()
    try:
        kept = _Cycle()
        gc.collect()
        assert gc.get_freeze_count() == 0, "nothing frozen inside the collector"
        pacer.tick()
        assert pacer.freezes == 1 and gc.get_freeze_count() > 0 and gc.is_tracked(kept)
        assert any(generation == 2 and seconds >= 0 for generation, seconds in pauses), pauses
        assert all(seconds < 60 for _, seconds in pauses)

        garbage = _Cycle()
        gc.collect()
        pacer.tick()  # (freezes the new cycle too: alive then)
        dead = weakref.ref(garbage)
        del garbage
        gc.collect()
        pacer.tick()
        assert dead() is not None, "a frozen garbage cycle waits for the thaw"

        now[0] = 600.0  # the thaw: the next full collection's tick collects the whole heap
        gc.collect()
        freezes = pacer.freezes
        pacer.tick()
        assert pacer.thaws == 1 and pacer.freezes == freezes, "thawed and collected, not frozen"
        assert dead() is None, "the thaw's collection freed the cycle"
        pacer.tick()
        assert pacer.freezes == freezes + 1, "the survivors of the thaw's collection frozen again"
        assert gc.is_tracked(kept)
    finally:
        pacer.close()
    assert gc.get_freeze_count() == 0 and pacer._on_gc not in gc.callbacks, "closed: nothing left frozen or hooked"


def test_a_cycle_that_died_since_the_full_collection_is_collected_before_the_freeze(thawed: None) -> None:
    pacer = GcPacer()
    pacer.install()
    try:
        gc.collect()
        died = _Cycle()
        dead = weakref.ref(died)
        del died
        pacer.tick()
        assert pacer.freezes == 1 and dead() is None, "young garbage is not frozen until the thaw"
    finally:
        pacer.close()


def test_off_it_reports_the_pauses_and_freezes_nothing(thawed: None) -> None:
    pauses: list[tuple[int, float]] = []
    pacer = GcPacer(refreeze_s=0.0, on_pause=lambda g, s: pauses.append((g, s)))
    pacer.install()
    try:
        gc.collect()
        pacer.tick()
        assert pacer.freezes == 0 and gc.get_freeze_count() == 0 and any(g == 2 for g, _ in pauses)
    finally:
        pacer.close()


def test_without_a_full_collection_a_tick_freezes_nothing(thawed: None) -> None:
    pacer = GcPacer()
    pacer.install()
    try:
        gc.collect(0)
        pacer.tick()
        assert pacer.freezes == 0 and gc.get_freeze_count() == 0
    finally:
        pacer.close()


async def test_run_ticks_from_the_loop_until_cancelled(thawed: None) -> None:
    pacer = GcPacer()
    pacer.install()
    runner = asyncio.create_task(pacer.run(every_s=0.01))
    try:
        gc.collect()
        await eventually(lambda: pacer.freezes >= 1, 10.0, "the loop's tick froze the survivors")
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        pacer.close()
    assert runner.cancelled()
