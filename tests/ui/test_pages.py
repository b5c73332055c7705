from __future__ import annotations

import pytest

from engine import Engine, Run
from engine.cli.demo.code_review import REVIEW
from engine.ui import pages
from engine.ui.pages import WINDOW, WindowCache, window_span


class TestWindowSpan:
    @pytest.mark.parametrize("last", [1, 20, WINDOW, WINDOW + 1, 1403, 200_000])
    def test_every_version_lies_in_its_window(self, last: int) -> None:
        """The window of any version holds it, is at most WINDOW long and stays in the run."""
        for at in range(1, last + 1, max(1, last // 997)):
            first, end = window_span(at, last)
            assert first >= 1
            assert first <= at
            assert at <= end
            assert end <= last
            assert end - first + 1 == min(WINDOW, last)

    @pytest.mark.parametrize(
        ("at", "last", "span"),
        [
            (1, 200_000, (1, 600)),
            (450, 200_000, (1, 600)),
            (451, 200_000, (301, 900)),
            (200_000, 200_000, (199_401, 200_000)),
            (5, 20, (1, 20)),
        ],
    )
    def test_known_windows(self, at: int, last: int, span: tuple[int, int]) -> None:
        """Windows step by half a window once the slider is a quarter window past the start."""
        assert window_span(at, last) == span

    def test_a_version_is_a_quarter_window_from_either_edge(self) -> None:
        """Inside a long run, the slider's version is at least WINDOW // 4 from each edge."""
        last = 20_000
        for at in range(WINDOW, last - WINDOW):
            first, end = window_span(at, last)
            assert at - first >= WINDOW // 4
            assert end - at >= WINDOW // 4

    def test_nearby_versions_share_a_window(self) -> None:
        """Windows start at multiples of half a window, so a run has few distinct ones."""
        spans = {window_span(at, 20_000) for at in range(1, 20_001)}
        assert len(spans) <= 20_000 // (WINDOW // 2)
        inside = {first for first, end in spans if end < 20_000}  # the run's end: its own
        assert {(first - 1) % (WINDOW // 2) for first in inside} == {0}


class TestWindowCache:
    def test_a_window_is_drawn_once_until_runs_are_erased(self, sqlite_url: str) -> None:
        """Versions of one span share one drawing; once runs are erased it is drawn again."""
        with Engine(sqlite_url) as engine:
            kept = _failing(engine, 20)
            engine.start_run(REVIEW).finish("deleted")
            data = pages.read_run(engine, kept.id)
            cache = WindowCache(size=2)
            drawn = cache.window(engine, data, *window_span(3, data.last_version))
            assert cache.window(engine, data, *window_span(15, data.last_version)) is drawn
            assert engine.compact().runs  # the store's erasure generation moves on
            again = cache.window(engine, data, *window_span(3, data.last_version))
            assert again is not drawn
            assert again.to_json() == drawn.to_json()

    def test_the_oldest_window_is_dropped(self, sqlite_url: str) -> None:
        """The cache holds at most `size` windows, dropping the least recently used."""
        with Engine(sqlite_url) as engine:
            run = _failing(engine, 10)
            data = pages.read_run(engine, run.id)
            cache = WindowCache(size=2)
            spans = [(1, 3), (4, 6), (7, 9)]
            first = [cache.window(engine, data, *span) for span in spans]
            assert cache.window(engine, data, *spans[2]) is first[2]
            assert cache.window(engine, data, *spans[0]) is not first[0]


def _failing(engine: Engine, failures: int) -> Run:
    """A code review whose developer fails `failures` times."""
    run = engine.start_run(REVIEW)
    run.stage_completed("project_analysis", {})
    run.stage_completed("code_review", {})
    for _ in range(failures):
        run.stage_failed("developer", "no")
    return run
