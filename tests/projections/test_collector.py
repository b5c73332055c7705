from __future__ import annotations

import gc
import threading
import uuid
import weakref
from typing import Any

import pytest

from events import NoteAdded
from projections import Projection, ProjectionError, collector, on

RID = uuid.uuid4()
FEW = collector.FEW
LONG = FEW + 10  # a fold long enough to pause the collector
assert FEW < 85


class Node:
    """An object that can sit in a reference cycle and be watched by a weakref."""

    partner: Any = None


def notes(count: int) -> list[NoteAdded]:
    return [NoteAdded(run_id=RID, version=v, key="k", value=v) for v in range(1, count + 1)]


class Cyclic(Projection[list[Any]]):
    def initial(self) -> list[Any]:
        return []

    @on(NoteAdded)
    def noted(self, state: list[Any], event: NoteAdded) -> list[Any]:
        first, second = Node(), Node()
        first.partner, second.partner = second, first  # garbage only the collector frees
        return [*state, weakref.ref(first)]


def slowed() -> bool:
    """Whether the young generation's threshold is the one of a long fold."""
    return gc.get_threshold()[0] == collector.FOLD_THRESHOLD


class TestCollectorPaused:
    def test_the_thresholds_are_restored_after_a_fold(self) -> None:
        """A fold slows the collector down and always gives back the thresholds it found."""
        before = gc.get_threshold()
        Cyclic().fold(notes(LONG))
        assert gc.get_threshold() == before
        assert gc.isenabled()

    def test_the_thresholds_are_restored_after_a_failing_fold(self) -> None:
        """A handler error does not leave the collector slowed down."""

        class Failing(Cyclic):
            @on(NoteAdded)
            def noted(self, state: list[Any], event: NoteAdded) -> list[Any]:
                raise RuntimeError("no")

        before = gc.get_threshold()
        with pytest.raises(ProjectionError):
            Failing().fold(notes(LONG))
        assert gc.get_threshold() == before

    def test_the_collector_is_never_switched_off(self) -> None:
        """During a long fold the collector stays enabled: only its threshold is raised."""
        seen: list[tuple[bool, bool]] = []

        class Watching(Cyclic):
            @on(NoteAdded)
            def noted(self, state: list[Any], event: NoteAdded) -> list[Any]:
                seen.append((gc.isenabled(), slowed()))
                return state

        Watching().fold(notes(LONG))
        assert seen == [(True, True)] * LONG

    def test_a_caller_who_paused_it_keeps_it_paused(self) -> None:
        """When the collector is already off, the fold leaves it off and its thresholds alone."""
        before = gc.get_threshold()
        gc.disable()
        try:
            Cyclic().fold(notes(LONG))
            assert not gc.isenabled()
            assert gc.get_threshold() == before
        finally:
            gc.enable()

    def test_another_thread_alive_leaves_the_collector_as_it_is(self) -> None:
        """While another thread runs (a follower, a viewer), a fold never changes the thresholds."""
        seen: list[bool] = []
        stop = threading.Event()

        class Watching(Cyclic):
            @on(NoteAdded)
            def noted(self, state: list[Any], event: NoteAdded) -> list[Any]:
                seen.append(slowed())
                return state

        other = threading.Thread(target=stop.wait)
        other.start()
        try:
            Watching().fold(notes(LONG))
        finally:
            stop.set()
            other.join()
        assert seen == [False] * LONG

    def test_a_nested_fold_leaves_the_outer_folds_thresholds(self) -> None:
        """A fold inside a fold neither raises nor restores the thresholds a second time."""
        seen: list[bool] = []

        class Nesting(Cyclic):
            @on(NoteAdded)
            def noted(self, state: list[Any], event: NoteAdded) -> list[Any]:
                if not state:
                    Cyclic().fold(notes(LONG))
                seen.append(slowed())
                return [*state, event.version]

        before = gc.get_threshold()
        Nesting().fold(notes(LONG))
        assert seen == [True] * LONG
        assert gc.get_threshold() == before

    def test_cycles_are_collected_during_long_folds(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every COLLECT_EVERY events a young collection frees cycles made by handlers."""
        monkeypatch.setattr(collector, "COLLECT_EVERY", 10)
        refs = Cyclic().fold(notes(85))  # more than FEW: slowed, collected at 10, 20 ... 80
        assert all(ref() is None for ref in refs[:80])

    @pytest.mark.parametrize(("count", "paused"), [(1, False), (FEW, False), (FEW + 1, True)])
    def test_only_folds_of_more_than_a_few_events_slow_it(self, count: int, paused: bool) -> None:
        """A point-in-time fold (FEW events or fewer) leaves the collector's threshold alone."""
        seen: list[bool] = []

        class Watching(Cyclic):
            @on(NoteAdded)
            def noted(self, state: list[Any], event: NoteAdded) -> list[Any]:
                seen.append(slowed())
                return state

        Watching().fold(notes(count))
        assert seen == [paused] * count
