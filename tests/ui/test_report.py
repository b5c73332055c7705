"""`stagetrail report RUN --html FILE`: one file whose slider works from file:// with no server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import Engine
from engine.errors import InvalidArgument
from engine.ui import build_report, pages, snapshot
from engine.ui import report as report_module
from tests.cli._helpers import as_json, fails, ok
from tests.ui._helpers import (
    HOSTILE_ERROR,
    HOSTILE_RESULT,
    SHOWN_ROWS,
    Stocked,
    move_slider,
    record_long,
    stack_rows,
    stock,
)
from tests.ui.conftest import screenshot


@pytest.fixture(scope="module")
def stocked(tmp_path_factory: pytest.TempPathFactory) -> Stocked:
    """A SQLite store with the examples, supervised runs and a hostile run."""
    return stock(f"sqlite:///{tmp_path_factory.mktemp('report') / 'runs.db'}")


@pytest.fixture(scope="module")
def engine(stocked: Stocked) -> Iterator[Engine]:
    """The stocked store, for the expected answers."""
    with Engine(stocked.url, create=False) as opened:
        yield opened


def offline(page: Any, path: Path) -> list[str]:
    """Open the report at `path` from file://; return every URL the page asked for."""
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", state="attached")
    return requested


@pytest.mark.browser
class TestOfflineReport:
    def test_the_slider_shows_the_projected_stack_with_no_server(
        self, stocked: Stocked, engine: Engine, page: Any, tmp_path: Path
    ) -> None:
        """From file://, the stack at each version N is engine.project(run, StateStack, at=N)."""
        run_id = stocked.filled.busy
        path = tmp_path / "busy.html"
        ok("report", str(run_id)[:8], "--html", str(path), "--store", stocked.url)
        requested = offline(page, path)
        last = len(engine.events(run_id))
        for version in range(1, last + 1):
            move_slider(page, version)
            shown = page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS)
            assert shown == stack_rows(engine, run_id, version), version
        assert requested == [path.as_uri()]  # nothing fetched: CSS, script, SVG all inline
        move_slider(page, 5)
        screenshot(page, "report-busy-at-5")

    def test_the_address_keeps_the_slider_s_version(
        self, stocked: Stocked, engine: Engine, page: Any, tmp_path: Path
    ) -> None:
        """A move sets #at=N in the report's address; opening that address shows version N."""
        run_id = stocked.filled.busy
        path = tmp_path / "busy.html"
        path.write_text(build_report(engine, run_id).html)
        offline(page, path)
        move_slider(page, 4)
        page.wait_for_url(path.as_uri() + "#at=4")
        page.goto("about:blank")
        page.goto(path.as_uri() + "#at=4")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.input_value("#slider") == "4"
        assert page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS) == stack_rows(
            engine, run_id, 4
        )

    def test_hostile_payloads_stay_text(self, stocked: Stocked, page: Any, tmp_path: Path) -> None:
        """Markup in the report's names, results and errors never runs; it reads as text."""
        path = tmp_path / "hostile.html"
        ok("report", str(stocked.hostile), "--html", str(path), "--store", stocked.url)
        offline(page, path)
        for version in (3, 4, 5):
            move_slider(page, version)
        page.click("#ev-4 summary")
        assert page.evaluate("window.__pwned") is None
        text = page.inner_text("body")
        assert HOSTILE_RESULT["html"] in text
        assert HOSTILE_ERROR in text
        assert page.locator("img").count() == 0

    def test_a_long_run_pages_its_events_offline(
        self, stocked: Stocked, engine: Engine, page: Any, tmp_path: Path
    ) -> None:
        """A report of a long run shows one page of events, the one the slider is in."""
        run_id = record_long(stocked.url, 100)  # 203 events: three pages
        path = tmp_path / "long.html"
        path.write_text(build_report(engine, run_id).html)
        offline(page, path)
        assert page.locator("ol.events li").count() == 3  # the newest page, at the newest event
        move_slider(page, 151)
        assert page.locator("ol.events li").count() == 100
        assert page.get_attribute("#ev-151", "class") == "at"
        assert page.inner_text("#events-range") == "events 101\u2013200 of 203"
        page.click("#ev-151 summary")
        assert "compile error #73" in page.inner_text("#ev-151 pre.payload")
        page.click("#events-prev")
        assert page.locator("#ev-1").count() == 1
        assert page.evaluate("window.__pwned") is None

    def test_a_long_run_keeps_a_window_and_says_what_it_left_out(
        self,
        stocked: Stocked,
        engine: Engine,
        page: Any,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Past the window, a report holds its newest events whole and spaced states before."""
        monkeypatch.setattr(pages, "EVENTS_PER_PAGE", 5)
        monkeypatch.setattr(report_module, "REPORT_WINDOW", 5)
        monkeypatch.setattr(report_module, "SPACED", 3)
        run_id = stocked.filled.retried
        report = build_report(engine, run_id)
        assert (report.events, report.embedded, report.first_listed) == (17, 10, 11)
        path = tmp_path / "spaced.html"
        path.write_text(report.html)
        offline(page, path)
        note = page.inner_text("#note")
        assert "holds events 11\u201317 of 17" in note
        assert "states of 3 evenly spaced versions" in note
        assert page.locator("ol.events li").count() == 2  # the page of 16-17, at the newest
        assert page.locator("template").count() == 2  # pages 11-15 and 16-17: no older one
        move_slider(page, 12)
        assert page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS) == stack_rows(
            engine, run_id, 12
        )
        assert page.is_hidden("#timeline-note")
        move_slider(page, 7)  # before the window: the nearest embedded version, 5
        shown = page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS)
        assert shown == stack_rows(engine, run_id, 5)
        assert "nearest embedded version" in page.inner_text("#slider-label")
        assert "event 7 is before them" in page.inner_text("#timeline-note")

    def test_a_report_stays_small_whatever_the_run_length(
        self, stocked: Stocked, engine: Engine
    ) -> None:
        """A 3,003-event run's report lists and draws its newest 1,000 events, no more."""
        run_id = record_long(stocked.url, 1500)
        report = build_report(engine, run_id)
        assert report.first_listed == 2001
        assert report.embedded == 1003 + report_module.SPACED
        listed = {int(v) for v in re.findall(r'<li id="ev-(\d+)"', report.html)}
        assert listed == set(range(2001, 3004))
        assert report.html.count('<rect class="bar') <= 1003
        assert len(report.html.encode()) < 5_000_000  # the target of docs/ui.md


class TestFullReport:
    def test_full_holds_every_event_and_state(self, stocked: Stocked, engine: Engine) -> None:
        """A full report of a run past the window lists, draws and embeds every version."""
        run_id = record_long(stocked.url, 600)  # 1,203 events
        report = build_report(engine, run_id, full=True)
        assert (report.first_listed, report.embedded, report.events) == (1, 1203, 1203)
        listed = {int(v) for v in re.findall(r'<li id="ev-(\d+)"', report.html)}
        assert listed == set(range(1, 1204))
        assert "This report holds events" not in report.html

    def test_full_refuses_a_run_past_its_limit(self, stocked: Stocked, tmp_path: Path) -> None:
        """--full of a run longer than --full-limit is one error naming both; nothing is written."""
        path = tmp_path / "full.html"
        args = ["report", str(stocked.filled.retried), "--html", str(path), "--full"]
        said = fails(*args, "--full-limit", "5", "--store", stocked.url)
        assert "has 17 events, more than the 5 a full report holds" in said
        assert "--full-limit 17" in said
        assert not path.exists()
        assert list(tmp_path.iterdir()) == []
        answer = as_json(*args, "--full-limit", "17", "--store", stocked.url)
        assert answer["events"] == answer["embedded_versions"] == 17

    def test_build_report_refuses_full_past_its_limit(
        self, stocked: Stocked, engine: Engine
    ) -> None:
        """`build_report(full=True)` refuses a run past `limit` (by default 10,000) events."""
        run_id = stocked.filled.retried
        with pytest.raises(InvalidArgument, match="more than the 10 a full report holds"):
            build_report(engine, run_id, full=True, limit=10)
        assert report_module.FULL_LIMIT == 10_000


class TestReportCommand:
    def test_json_names_the_file_and_the_versions(self, stocked: Stocked, tmp_path: Path) -> None:
        """`report --json` says where the report went and how many versions it embeds."""
        path = tmp_path / "clean.html"
        answer = as_json(
            "report", str(stocked.filled.clean), "--html", str(path), "--store", stocked.url
        )
        assert answer["file"] == str(path)
        assert answer["events"] == answer["embedded_versions"] == 9
        assert path.read_text().startswith("<!doctype html>")

    def test_the_report_is_one_file(self, stocked: Stocked, engine: Engine) -> None:
        """No stylesheet, script or image is linked: everything is inline."""
        html = build_report(engine, stocked.filled.clean).html
        assert '<link rel="stylesheet"' not in html
        assert "<script src" not in html
        assert "http://" not in html.replace("http://www.w3.org", "")
        assert "<svg" in html
        assert "Content-Security-Policy" in html


class TestWhatALongReportSays:
    def test_the_command_says_what_the_report_left_out(
        self, stocked: Stocked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`stagetrail report` of a run past the window names the events and states it holds."""
        monkeypatch.setattr(pages, "EVENTS_PER_PAGE", 5)
        monkeypatch.setattr(report_module, "REPORT_WINDOW", 5)
        monkeypatch.setattr(report_module, "SPACED", 3)
        path = tmp_path / "retried.html"
        said = ok(
            "report", str(stocked.filled.retried), "--html", str(path), "--store", stocked.url
        )
        assert "it holds events 11-17 whole and the states of 3 evenly spaced earlier" in said

    def test_the_docs_give_the_report_s_and_the_page_s_numbers(self) -> None:
        """docs/ui.md states the window, the report's window, its spaced versions and frames."""
        text = " ".join((Path(__file__).parents[2] / "docs" / "ui.md").read_text().split())
        assert f"draws the {pages.WINDOW} events around the slider" in text
        assert f"up to {report_module.REPORT_WINDOW:,} events is held whole" in text
        assert f"its newest {report_module.REPORT_WINDOW:,} events" in text
        assert f"states of {report_module.SPACED} evenly spaced earlier versions" in text
        assert f"list the newest {report_module.SPACED_FRAMES} frames" in text
        assert f"the {pages.EVENTS_PER_PAGE} events of the slider's page" in text
        assert f"newest {snapshot.SHOWN_FRAMES} frames of a deeper stack" in text


class TestSpacedVersions:
    @pytest.mark.parametrize(
        ("last", "limit", "expected"),
        [
            (1, 5, [1]),
            (5, 5, [1, 2, 3, 4, 5]),
            (6, 5, [1, 2, 3, 5, 6]),
            (17, 5, [1, 5, 9, 13, 17]),
            (10_000, 3, [1, 5001, 10_000]),
        ],
    )
    def test_first_and_last_are_kept(self, last: int, limit: int, expected: list[int]) -> None:
        """Every version up to the limit; past it, `limit` evenly spaced ones, ends included."""
        assert snapshot.spaced_versions(last, limit) == expected
