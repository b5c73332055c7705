"""The run page's address in a real browser: a reload or a share opens the version moved to.

A module of its own: Playwright's clock (which other modules install) also hides the
navigation's type from the page, so these tests run in a browser where it never was (it is
installed on the whole browser context, every later tab included: no test here installs it).
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import Engine
from tests.ui._helpers import (
    COUNT_ADDRESS_WRITES,
    SHOWN_ROWS,
    Stocked,
    move_slider,
    stack_rows,
    stocked_fixtures,
)
from tests.ui.conftest import Served

pytestmark = pytest.mark.browser


stocked, viewer, engine = stocked_fixtures("address")


HOLD_ADDRESS_TIMER = """() => {
  const start = window.setTimeout.bind(window);
  window.setTimeout = (callback, delay, ...rest) =>
    delay === 300 ? 0 : start(callback, delay, ...rest);
}"""
"""Playwright: the page's 300 ms timers never fire (the slider never rests), other timers do.
(Playwright's clock would do, but it hides the navigation's type from the page.)"""


LEAVE_NOTE_AFTER_THE_PAGE = """note => window.addEventListener("pagehide", function () {
  sessionStorage.setItem("stagetrail.reload", note.split("HREF").join(location.href));
})"""
"""Playwright: as the page is left (after its own `pagehide`), note `note` for the reload,
with HREF replaced by the page's address (what a tampered sessionStorage would hold)."""


STORAGE_REFUSED = """Object.defineProperty(window, "sessionStorage", {
  get() { throw new DOMException("storage is disabled", "SecurityError"); },
});"""
"""Playwright init script: the tab's sessionStorage refuses every use (storage disabled)."""


BACK_FORWARD_CACHE = """() => {
  window.dispatchEvent(new PageTransitionEvent("pagehide", {persisted: true}));
  window.dispatchEvent(new PageTransitionEvent("pageshow", {persisted: true}));
}"""
"""Playwright: the page is left into the back/forward cache and shown from it again (the
events a browser fires then; Playwright's Chromium keeps no such cache of its own)."""


HIDE_PAGE = """() => {
  Object.defineProperty(document, "visibilityState", {value: "hidden", configurable: true});
  document.dispatchEvent(new Event("visibilitychange"));
}"""
"""Playwright: the page is hidden (another tab shown, the window minimized)."""


def open_at(page: Any, address: str) -> None:
    """Open `address` and wait until the page is ready."""
    page.goto(address)
    page.wait_for_selector("body[data-ready='1']", state="attached")


def reload(page: Any) -> None:
    """Reload the page and wait until it is ready."""
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")


class TestAddress:
    def test_a_reload_before_the_slider_rests_opens_the_version_moved_to(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """A reload within the 300 ms before the address is written opens at the version the
        slider was moved to (not the address's older one), and the address then says so."""
        run_id = stocked.filled.busy
        page.goto(f"{viewer.base}/runs/{run_id}?at=2")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        page.evaluate(HOLD_ADDRESS_TIMER)
        move_slider(page, 5)
        move_slider(page, 4)
        page.reload()
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.get_attribute("body", "data-shown-version") == "4"
        assert page.input_value("#slider") == "4"
        assert page.url == f"{viewer.base}/runs/{run_id}?at=4"
        assert page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS) == stack_rows(
            engine, run_id, 4
        )

    def test_a_version_noted_for_a_reload_is_used_by_that_reload_only(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """A page opened afresh at the same address opens at the address's version, and a
        second reload at the written address's: the note serves one reload of its page."""
        run_id = stocked.filled.busy
        page.goto(f"{viewer.base}/runs/{run_id}?at=2")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        page.evaluate(HOLD_ADDRESS_TIMER)
        move_slider(page, 4)
        page.goto(f"{viewer.base}/runs/{run_id}?at=2")  # typed again: not a reload
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.get_attribute("body", "data-shown-version") == "2"
        page.reload()
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert page.get_attribute("body", "data-shown-version") == "2"

    def test_a_page_losing_the_focus_writes_its_address_at_once(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """When the page loses the focus (to the address bar, to copy the address) before the
        slider rests, the address is written then, with the version moved to."""
        run_id = stocked.filled.busy
        open_at(page, f"{viewer.base}/runs/{run_id}?at=2")
        page.evaluate(HOLD_ADDRESS_TIMER)  # not Playwright's clock: it would be the context's
        page.evaluate(COUNT_ADDRESS_WRITES)
        move_slider(page, 5)
        assert page.evaluate("() => window.addressWrites") == []
        page.evaluate("() => window.dispatchEvent(new FocusEvent('blur'))")
        assert page.evaluate("() => window.addressWrites") == ["?at=5"]
        assert page.url == f"{viewer.base}/runs/{run_id}?at=5"

    def test_a_hidden_page_writes_its_address_once_per_change_of_focus(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """Moves write nothing until the page is hidden, which writes the version moved to
        once; hiding or blurring again without a move writes nothing more."""
        run_id = stocked.filled.busy
        open_at(page, f"{viewer.base}/runs/{run_id}?at=2")
        page.evaluate(HOLD_ADDRESS_TIMER)
        page.evaluate(COUNT_ADDRESS_WRITES)
        for version in (3, 6, 5):
            move_slider(page, version)
        assert page.evaluate("() => window.addressWrites") == []
        page.evaluate(HIDE_PAGE)
        assert page.evaluate("() => window.addressWrites") == ["?at=5"]
        page.evaluate(HIDE_PAGE)
        page.evaluate("() => window.dispatchEvent(new FocusEvent('blur'))")
        assert page.evaluate("() => window.addressWrites") == ["?at=5"]
        assert page.url == f"{viewer.base}/runs/{run_id}?at=5"

    def test_a_page_shown_again_from_the_back_forward_cache_drops_its_note(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """A page left while moving, shown again from the back/forward cache, moved back to
        its first version and reloaded at rest opens there, not at the version noted then."""
        run_id = stocked.filled.busy
        open_at(page, f"{viewer.base}/runs/{run_id}?at=2")
        page.evaluate(HOLD_ADDRESS_TIMER)
        move_slider(page, 5)
        page.evaluate(BACK_FORWARD_CACHE)  # noted: a reload of ?at=2 opens at 5
        assert page.url == f"{viewer.base}/runs/{run_id}?at=5"
        move_slider(page, 2)
        page.evaluate("() => window.dispatchEvent(new FocusEvent('blur'))")  # ?at=2 written
        assert page.url == f"{viewer.base}/runs/{run_id}?at=2"
        reload(page)
        assert page.get_attribute("body", "data-shown-version") == "2"

    @pytest.mark.parametrize(
        "note",
        [
            '{"address": "HREF", "version": 5',
            '{"address": "HREF", "version": "5<img src=x onerror=window.__pwned=5>"}',
            '{"address": "HREF", "version": 5.5}',
            '{"address": ["HREF"], "version": 5}',
            '"HREF"',
            '{"address": "HREF", "version": 5, "padding": "' + "x" * 30_000 + '"}',
        ],
        ids=["cut", "markup", "fraction", "list", "string", "oversized"],
    )
    def test_a_tampered_note_is_ignored_and_removed(
        self, viewer: Served, stocked: Stocked, page: Any, note: str
    ) -> None:
        """A reload with a note the page did not write (cut, not an integer, too long) opens
        at its address's version, runs nothing of it, and the note is gone afterwards."""
        run_id = stocked.filled.busy
        open_at(page, f"{viewer.base}/runs/{run_id}?at=2")
        page.evaluate(LEAVE_NOTE_AFTER_THE_PAGE, note)
        reload(page)
        assert page.get_attribute("body", "data-shown-version") == "2"
        assert page.evaluate("() => sessionStorage.getItem('stagetrail.reload')") is None
        assert page.evaluate("() => window.__pwned") is None

    def test_a_note_within_bounds_is_taken(
        self, viewer: Served, stocked: Stocked, page: Any
    ) -> None:
        """The same way of noting, with a note as the page writes it, opens at its version
        (so the tampered notes above are refused for what they hold, not for how they came)."""
        run_id = stocked.filled.busy
        open_at(page, f"{viewer.base}/runs/{run_id}?at=2")
        page.evaluate(LEAVE_NOTE_AFTER_THE_PAGE, '{"address": "HREF", "version": 5}')
        reload(page)
        assert page.get_attribute("body", "data-shown-version") == "5"
        assert page.url == f"{viewer.base}/runs/{run_id}?at=5"

    def test_the_page_works_without_session_storage(
        self, viewer: Served, stocked: Stocked, engine: Engine, page: Any
    ) -> None:
        """With sessionStorage refused (storage disabled), leaving while moving and reloading
        raise nothing (the page fixture fails on a script error) and the page opens."""
        run_id = stocked.filled.busy
        page.add_init_script(STORAGE_REFUSED)
        open_at(page, f"{viewer.base}/runs/{run_id}?at=2")
        page.evaluate(HOLD_ADDRESS_TIMER)
        move_slider(page, 4)
        reload(page)
        shown = page.get_attribute("body", "data-shown-version")
        assert page.eval_on_selector_all("#stack tbody tr", SHOWN_ROWS) == stack_rows(
            engine, run_id, int(shown or 0)
        )
        move_slider(page, 3)
        assert page.input_value("#slider") == "3"
