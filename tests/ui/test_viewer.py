"""`stagetrail ui` in a real browser: the runs page, the run page, the time slider, escaping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine import Engine, Pipeline
from engine.ui.gantt import LABELS
from engine.ui.pages import WINDOW
from events import StageCompleted, StageFailed
from projections import StageResults
from tests.ui._helpers import (
    COUNT_ADDRESS_WRITES,
    HIGHLIGHTED,
    HOSTILE_ERROR,
    HOSTILE_RESULT,
    HOSTILE_STAGE,
    SHOWN_ROWS,
    UNCOVERED_BAR,
    Stocked,
    move_slider,
    pointer_off_the_timeline,
    record_long,
    stack_rows,
    stocked_fixtures,
)
from tests.ui.conftest import Served, screenshot

pytestmark = pytest.mark.browser


stocked, viewer, engine = stocked_fixtures("viewer")


COUNT_ROW_CHANGES = """() => {
  window.rowChanges = {added: 0, removed: 0};
  new MutationObserver(function (records) {
    records.forEach(function (record) {
      window.rowChanges.added += record.addedNodes.length;
      window.rowChanges.removed += record.removedNodes.length;
    });
  }).observe(document.querySelector("#stack tbody"), {childList: true});
}"""
"""Playwright: count the rows put into and taken out of the stack table from now on."""


COUNT_RESULTS_CHANGES = """() => {
  window.resultsChanges = 0;
  new MutationObserver(function () { window.resultsChanges += 1; })
    .observe(document.querySelector("#results tbody"), {childList: true});
}"""
"""Playwright: count the times the stage results table is drawn again from now on."""


def _attempts(engine: Engine, run_id: Any) -> int:
    return sum(isinstance(e, StageCompleted | StageFailed) for e in engine.events(run_id))


class TestRunsPage:
    def test_lists_every_run_newest_first(self, viewer: Served, engine: Engine, page: Any) -> None:
        """The runs page lists the run index's runs, in its order (newest first)."""
        page.goto(viewer.base + "/")
        shown = page.eval_on_selector_all("tr.run", "rows => rows.map(r => r.dataset.runId)")
        assert shown == [str(run.run_id) for run in engine.runs(limit=50)]
        assert len(shown) >= 8
        screenshot(page, "runs")

    @pytest.mark.parametrize(
        ("query", "filters"),
        [
            ("status=failed", {"status": "failed"}),
            ("pipeline=code-review", {"pipeline": "code-review"}),
            ("label=team%3Dcore", {"label": "team=core"}),
        ],
    )
    def test_filters_match_the_library(
        self, viewer: Served, engine: Engine, page: Any, query: str, filters: dict[str, str]
    ) -> None:
        """Each filter of the page lists what engine.runs() gives for it."""
        page.goto(f"{viewer.base}/?{query}")
        shown = page.eval_on_selector_all("tr.run", "rows => rows.map(r => r.dataset.runId)")
        expected = [str(run.run_id) for run in engine.runs(**filters)]  # type: ignore[arg-type]
        assert shown == expected
        assert expected

    def test_a_bad_filter_is_one_clear_error(self, viewer: Served, page: Any) -> None:
        """An unknown status shows the library's error, naming the argument."""
        response = page.goto(viewer.base + "/?status=sleeping")
        assert response.status == 400
        assert "status" in page.inner_text("p.error")


class TestRunPage:
    def test_one_bar_per_attempt(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """The timeline draws one bar per stage attempt, failed and retried ones coloured apart."""
        run_id = stocked.filled.retried
        page.goto(f"{viewer.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.locator("rect.bar").count() == _attempts(engine, run_id)
        assert page.locator("rect.bar.retried").count() == 3  # two builds, one test run
        assert page.locator("rect.bar.completed").count() == _attempts(engine, run_id) - 3

    def test_decisions_are_marked(self, viewer: Served, stocked: Stocked, page: Any) -> None:
        """Retries, the breaker, a rollback and a stuck verdict each get a marker."""
        page.goto(f"{viewer.base}/runs/{stocked.filled.busy}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        kinds = page.eval_on_selector_all("path.marker", "marks => marks.map(m => m.classList[1])")
        assert sorted(kinds) == ["breaker", "retry", "rollback", "verdict"]
        assert page.locator("rect.bar.rolled_back").count() == 1

    def test_the_slider_shows_the_projected_stack_at_every_version(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """At each version N the stack table is engine.project(run, StateStack, at=N), by row."""
        run_id = stocked.filled.retried
        last = len(engine.events(run_id))
        page.goto(f"{viewer.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        for version in [*range(1, last + 1), 3]:
            move_slider(page, version)
            shown = page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS)
            assert shown == stack_rows(engine, run_id, version), version
        move_slider(page, 8)
        results = engine.project(run_id, StageResults, at=8)
        expected = [
            [stage, str(len(tried)), tried[-1].outcome, f"{tried[-1].duration:.1f}s"]
            for stage, tried in ((stage, results.attempts(stage)) for stage in results.stages)
        ]
        shown = page.eval_on_selector_all("#results tbody tr", SHOWN_ROWS)
        assert [row[:4] for row in shown] == expected
        assert shown[0][4] == '{"project_type":"python"}'
        current = page.inner_text("#current-state")
        assert current == "developer"
        highlighted = page.eval_on_selector_all("svg.pipeline g.node.current", HIGHLIGHTED)
        assert highlighted == [current]
        screenshot(page, "run-at-8")

    def test_events_expand_to_their_payload(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """Clicking an event shows its whole payload."""
        page.goto(f"{viewer.base}/runs/{stocked.filled.retried}")
        payload = page.locator("#ev-6 pre.payload")
        assert not payload.is_visible()
        page.click("#ev-6 summary")
        assert payload.is_visible()
        assert '"error_type": "BuildException"' in payload.inner_text()

    def test_the_slider_leads_to_its_event_on_another_page(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """On a long run, a version on another page of events links there, slider kept."""
        run_id = record_long(stocked.url, 150)  # 303 events: four pages, 152 frames
        page.goto(f"{viewer.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        move_slider(page, 251)
        jump = page.locator("#events-jump")
        assert jump.is_visible()
        with page.expect_navigation():
            jump.click()
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.input_value("#slider") == "251"
        assert page.get_attribute("#ev-251", "class") == "at"
        assert not jump.is_visible()
        expected = stack_rows(engine, run_id, 251)
        assert len(expected) == 126  # deeper than the 100 frames a view lists
        assert page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS) == expected[-100:]
        assert page.inner_text("#stack-hidden") == "26 older frames not listed"

    def test_a_step_moves_only_the_stack_rows_that_changed(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """A step that pushes one frame onto a full list adds one row and drops one, no more."""
        run_id = record_long(stocked.url, 150)  # 303 events: 152 frames
        page.goto(f"{viewer.base}/runs/{run_id}?at=250")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        page.evaluate(COUNT_ROW_CHANGES)
        move_slider(page, 251)  # a StageFailed: one frame more
        assert page.evaluate("() => window.rowChanges") == {"added": 1, "removed": 1}

    def test_a_step_leaves_the_panels_it_does_not_change_alone(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """A step onto a StageStarted draws the stage results again only when they change:
        not then (an attempt opened), and the next step's failure does."""
        run_id = record_long(stocked.url, 150)
        page.goto(f"{viewer.base}/runs/{run_id}?at=249")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        page.evaluate(COUNT_RESULTS_CHANGES)
        move_slider(page, 250)  # a StageStarted: no result changes, a counter does
        assert page.evaluate("() => window.resultsChanges") == 0
        assert page.inner_text("#retries").count("open attempt") == 1
        move_slider(page, 251)  # a StageFailed
        assert page.evaluate("() => window.resultsChanges") == 1
        shown = page.eval_on_selector_all("#results tbody tr", SHOWN_ROWS)
        expected = engine.project(run_id, StageResults, at=251)
        developer = next(row for row in shown if row[0] == "developer")
        assert developer[1] == str(len(expected.by_stage["developer"]))

    def test_only_the_newest_stack_rows_are_drawn_until_scrolled_to(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """The older of the 100 rows listed are hidden at a move and shown once scrolled to."""
        run_id = record_long(stocked.url, 150)
        page.goto(f"{viewer.base}/runs/{run_id}?at=251")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        shown = "rows => rows.map(row => row.cells[1].textContent)"
        expected = [row[1] for row in stack_rows(engine, run_id, 251)[-100:]]
        assert page.eval_on_selector_all("#stack tbody tr:not([hidden])", shown) == expected[-24:]
        page.eval_on_selector("#stack-panel", "panel => { panel.scrollTop = 0; }")
        page.wait_for_selector("#stack tbody tr[hidden]", state="detached")
        assert page.eval_on_selector_all("#stack tbody tr:not([hidden])", shown) == expected
        move_slider(page, 250)
        assert page.locator("#stack tbody tr:not([hidden])").count() == 24

    def test_a_scroll_to_the_top_pending_at_a_move_shows_no_older_rows(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """A scroll event that arrives after a move drew the stack, before the drawing's own
        scroll to its newest rows, leaves the older rows hidden."""
        run_id = record_long(stocked.url, 150)
        page.goto(f"{viewer.base}/runs/{run_id}?at=251")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        # hold the page's animation frames, so the drawing's scroll to the bottom waits
        page.evaluate(
            "() => { window.heldFrames = []; window.requestAnimationFrame ="
            " callback => window.heldFrames.push(callback); }"
        )
        move_slider(page, 250)
        page.evaluate(
            """() => new Promise(resolve => {
                const panel = document.getElementById('stack-panel');
                panel.addEventListener('scroll', () => resolve(), {once: true});
                panel.scrollTop = 0;
            })"""
        )
        assert page.locator("#stack tbody tr:not([hidden])").count() == 24
        page.evaluate("() => window.heldFrames.forEach(callback => callback(0))")
        assert page.locator("#stack tbody tr:not([hidden])").count() == 24

    def test_the_address_follows_the_slider_and_opens_there(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """Moving the slider sets ?at=N in the address; that address opens at version N."""
        run_id = stocked.filled.retried
        page.goto(f"{viewer.base}/runs/{str(run_id)[:8]}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        move_slider(page, 4)
        page.wait_for_url(f"{viewer.base}/runs/{run_id}?at=4")
        shared = page.url
        page.goto("about:blank")
        page.goto(shared)
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.input_value("#slider") == "4"
        assert page.get_attribute("body", "data-shown-version") == "4"
        assert page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS) == stack_rows(
            engine, run_id, 4
        )

    def test_the_address_is_written_once_the_slider_rests(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """Moves in quick succession leave the address alone; 300 ms after the last one drawn it
        is written once, with that move's version."""
        run_id = stocked.filled.busy
        page.clock.install()
        page.goto(f"{viewer.base}/runs/{run_id}?at=2")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        page.clock.pause_at(page.evaluate("() => Date.now()") + 1000)  # time flows no more
        page.evaluate(COUNT_ADDRESS_WRITES)
        for version in (3, 5, 4):
            move_slider(page, version)
        page.clock.run_for(299)
        assert page.evaluate("() => window.addressWrites") == []
        page.clock.run_for(2)
        assert page.evaluate("() => window.addressWrites") == ["?at=4"]
        assert page.url == f"{viewer.base}/runs/{run_id}?at=4"

    def test_a_page_left_before_the_slider_rests_comes_back_where_it_was(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """A move whose address was not yet written when the page is left is written as it goes:
        back to it, the address and the page are at the version the slider was moved to."""
        run_id = stocked.filled.busy
        page.clock.install()
        page.goto(f"{viewer.base}/runs/{run_id}?at=2")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        page.clock.pause_at(page.evaluate("() => Date.now()") + 1000)  # time flows no more
        move_slider(page, 4)
        page.goto("about:blank")
        page.go_back()
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.url == f"{viewer.base}/runs/{run_id}?at=4"
        assert page.get_attribute("body", "data-shown-version") == "4"

    def test_only_what_came_after_the_slider_fades(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """At the last event nothing is faded; at N exactly the bars and markers after N are."""
        run_id = stocked.filled.busy
        last = len(engine.events(run_id))
        page.goto(f"{viewer.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.locator("#gantt .later").count() == 0
        versions = "els => els.map(e => Number(e.dataset.version))"
        for version in (6, 2, last - 1, last):
            move_slider(page, version)
            faded = page.eval_on_selector_all("#gantt .later", versions)
            drawn = page.eval_on_selector_all("#gantt [data-version]", versions)
            assert sorted(faded) == sorted(v for v in drawn if v > version), version
        screenshot(page, "busy-at-last")

    def test_a_window_drawn_again_fades_exactly_what_came_after_the_slider(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """Back in a window the page drew before (faded then at another version), exactly the
        bars and markers after the slider's version are faded."""
        run_id = record_long(stocked.url, 700)  # 1,403 events: windows 1-600 and 804-1403
        page.goto(f"{viewer.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        versions = "els => els.map(e => Number(e.dataset.version))"
        for version in (900, 10, 1300, 5, 400, 1403):
            move_slider(page, version)
            faded = page.eval_on_selector_all("#gantt .later", versions)
            drawn = page.eval_on_selector_all("#gantt [data-version]", versions)
            assert min(drawn) <= version <= max(drawn)
            assert sorted(faded) == sorted(v for v in drawn if v > version), version

    def test_an_attempt_has_one_duration_in_the_stack_and_the_timeline(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """Each stack row's time is the one its bar's tooltip says."""
        run_id = stocked.supervised[1]
        page.goto(f"{viewer.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        rows = page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS)
        assert rows
        for row in rows:
            tip = page.get_attribute(f"#gantt rect.bar[data-version='{row[1]}']", "aria-label")
            assert f", {row[6]}, event {row[1]}" in (tip or ""), row

    def test_a_bar_s_tooltip_is_made_when_the_pointer_comes_over_it(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """No bar has a <title> until the pointer is over it; then it has its label as one,
        in a window drawn with the page and in one fetched as the slider moved."""
        run_id = record_long(stocked.url, 700)  # 1,403 events: a window is fetched
        page.goto(f"{viewer.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        for version in (1403, 10):
            pointer_off_the_timeline(page)
            move_slider(page, version)
            assert page.locator("#gantt [data-version] title").count() == 0
            bar = page.locator(UNCOVERED_BAR)
            bar.hover()
            label = bar.get_attribute("aria-label")
            assert "attempt" in (label or "")
            assert bar.locator("title").text_content() == label

    def test_the_timeline_is_a_window_that_follows_the_slider(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """A long run draws the events around the slider; a move far away draws its own."""
        run_id = record_long(stocked.url, 700)  # 1,403 events
        page.goto(f"{viewer.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        versions = "els => els.map(e => Number(e.dataset.version))"
        assert page.inner_text("#window-span") == f"{1403 - WINDOW + 1}\u20131403"
        assert min(page.eval_on_selector_all("#gantt [data-version]", versions)) > 1403 - WINDOW
        move_slider(page, 10)
        assert page.inner_text("#window-span") == f"1\u2013{WINDOW}"
        drawn = page.eval_on_selector_all("#gantt [data-version]", versions)
        assert max(drawn) <= WINDOW
        assert page.locator("#gantt rect.bar").count() == len(set(drawn))
        assert page.eval_on_selector("#cursor", "line => line.style.display") == ""
        assert float(page.get_attribute("#cursor", "x1") or 0) >= LABELS  # on the drawing
        assert page.eval_on_selector("#gantt", "svg => svg.namespaceURI") == (
            "http://www.w3.org/2000/svg"
        )

    def test_a_fetched_window_draws_a_stage_named_with_a_control_character(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """A window fetched as the slider moves far draws a stage whose name holds ESC (an XML
        parser refuses the character), its row labelled with the name as recorded."""
        name = "build \x1b[31m"
        transitions = [(name, "failed", name), (name, "completed", "done")]
        pipeline = Pipeline("esc", initial=name, transitions=transitions, final=["done"])
        with Engine(stocked.url) as engine:
            run = engine.start_run(pipeline)
            for attempt in range(400):  # 801 events: the page opens on another window
                run.stage_started(name)
                run.stage_failed(name, f"error #{attempt}", error_type="Broken")
        page.goto(f"{viewer.base}/runs/{run.id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        move_slider(page, 10)
        assert page.inner_text("#window-span") == f"1\u2013{WINDOW}"
        assert page.eval_on_selector_all(
            "#gantt .row-label title", "titles => titles.map(t => t.textContent)"
        ) == [name]
        assert page.locator("#gantt rect.bar").count() == WINDOW // 2
        assert page.get_attribute("body", "data-shown-version") == "10"

    def test_hostile_stage_names_are_drawn_as_text_in_every_window(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """Stage names that are markup, an entity, control characters or end in a backslash run
        no script and load nothing, in the window drawn with the page and in one fetched; each
        row is labelled, and each bar's tooltip made, with the name as recorded."""
        names = [
            '</svg><img src=x onerror="window.hacked=1">',
            "<script>window.hacked=2</script>",
            "<&x;>]]><!--",
            "ctl \x01\x1b[31m\x7f\r\n",
            "trail\\",
        ]
        ring = names[1:] + names[:1]
        transitions = [(name, "completed", after) for name, after in zip(names, ring, strict=True)]
        pipeline = Pipeline(
            "hostile",
            initial=names[0],
            transitions=[*transitions, (names[0], "finished", "done")],
            final=["done"],
        )
        with Engine(stocked.url) as engine:
            run = engine.start_run(pipeline)
            for _ in range(90):  # 900 events: the page opens on another window
                for name in names:
                    run.stage_started(name)
                    run.stage_completed(name)
        page.goto(f"{viewer.base}/runs/{run.id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        for version in (None, 10):
            if version is not None:
                pointer_off_the_timeline(page)
                move_slider(page, version)
                assert page.inner_text("#window-span") == f"1\u2013{WINDOW}"
            assert (
                page.eval_on_selector_all(
                    "#gantt .row-label title", "titles => titles.map(t => t.textContent)"
                )
                == names
            )
            assert page.locator("#gantt img, #gantt script, #gantt foreignObject").count() == 0
            assert page.eval_on_selector("#gantt", "svg => svg.namespaceURI") == (
                "http://www.w3.org/2000/svg"
            )
            bar = page.locator(UNCOVERED_BAR)
            bar.hover()
            label = bar.get_attribute("aria-label") or ""
            assert label.split(" attempt ")[0] in names
            assert bar.locator("title").text_content() == label
        assert page.evaluate("() => window.hacked") is None

    def test_a_supervised_run_draws_its_retries(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """The breaker-cycle run of the supervisor shows its bars and breaker markers."""
        run_id = stocked.supervised[1]
        page.goto(f"{viewer.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.locator("rect.bar").count() == _attempts(engine, run_id)
        assert page.locator("path.marker.breaker").count() >= 2
        screenshot(page, "supervised")


class TestEscaping:
    def test_hostile_names_and_payloads_show_as_text(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """Markup in a stage name, a result, an error or a label never runs; it reads as text."""
        page.goto(f"{viewer.base}/runs/{stocked.hostile}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        for version in (4, 5, 3):
            move_slider(page, version)
        page.click("#ev-4 summary")
        page.click("#ev-3 summary")
        assert page.evaluate("window.__pwned") is None
        text = page.inner_text("body")
        assert HOSTILE_RESULT["html"] in text
        assert HOSTILE_ERROR in text
        assert HOSTILE_STAGE in page.inner_text("#stack")
        highlighted = page.eval_on_selector_all("svg.pipeline g.node.current", HIGHLIGHTED)
        assert highlighted == [HOSTILE_STAGE]  # the state at version 3, its name as recorded
        assert page.locator("img").count() == 0
        assert page.locator("main script:not([type='application/json'])").count() == 0
        page.goto(viewer.base + "/")
        assert page.evaluate("window.__pwned") is None
        assert "<script>window.__pwned=5</script>" in page.inner_text("table.runs")

    def test_pages_forbid_inline_script(self, viewer: Served, stocked: Stocked, page: Any) -> None:
        """Every page is sent with a policy that refuses inline script, a second line of defence."""
        response = page.goto(f"{viewer.base}/runs/{stocked.hostile}")
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy
        assert "unsafe-inline" not in policy


def test_artifacts_are_git_ignored() -> None:
    """The screenshots the tests take stay out of the repository."""
    ignore = Path(__file__).resolve().parents[2] / ".gitignore"
    assert "tests/ui/artifacts/" in ignore.read_text().splitlines()
