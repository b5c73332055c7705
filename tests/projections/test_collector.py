from __future__ import annotations

import gc
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


class TestCollectorPaused:
    def test_the_collector_is_on_again_after_a_fold(self) -> None:
        """A fold pauses the cyclic collector and always turns it back on."""
        assert gc.isenabled()
        Cyclic().fold(notes(LONG))
        assert gc.isenabled()

    def test_the_collector_is_on_again_after_a_failing_fold(self) -> None:
        """A handler error does not leave the collector off."""

        class Failing(Cyclic):
            @on(NoteAdded)
            def noted(self, state: list[Any], event: NoteAdded) -> list[Any]:
                raise RuntimeError("no")

        with pytest.raises(ProjectionError):
            Failing().fold(notes(LONG))
        assert gc.isenabled()

    def test_a_caller_who_paused_it_keeps_it_paused(self) -> None:
        """When the collector is already off, the fold leaves it off."""
        gc.disable()
        try:
            Cyclic().fold(notes(LONG))
            assert not gc.isenabled()
        finally:
            gc.enable()

    def test_cycles_are_collected_during_long_folds(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every COLLECT_EVERY events a young collection frees cycles made by handlers."""
        monkeypatch.setattr(collector, "COLLECT_EVERY", 10)
        refs = Cyclic().fold(notes(85))  # more than FEW: paused, collected at 10, 20 ... 80
        assert all(ref() is None for ref in refs[:80])

    @pytest.mark.parametrize(("count", "paused"), [(1, False), (FEW, False), (FEW + 1, True)])
    def test_only_folds_of_more_than_a_few_events_pause_it(self, count: int, paused: bool) -> None:
        """A point-in-time fold (FEW events or fewer) leaves the collector on while it runs."""
        seen: list[bool] = []

        class Watching(Cyclic):
            @on(NoteAdded)
            def noted(self, state: list[Any], event: NoteAdded) -> list[Any]:
                seen.append(gc.isenabled())
                return state

        Watching().fold(notes(count))
        assert seen == [not paused] * count
        assert gc.isenabled()
