"""The run page's address in a real browser: a reload or a share opens the version moved to.

A module of its own: Playwright's clock (which other modules install) also hides the
navigation's type from the page, so these tests run in a browser where it never was.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine import Engine
from tests.ui._helpers import SHOWN_ROWS, Stocked, move_slider, stack_rows, stock
from tests.ui.conftest import Served

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def stocked(tmp_path_factory: pytest.TempPathFactory) -> Stocked:
    """A SQLite store with the examples, supervised runs and a hostile run."""
    return stock(f"sqlite:///{tmp_path_factory.mktemp('address') / 'runs.db'}")


@pytest.fixture(scope="module")
def viewer(serve: Any, stocked: Stocked) -> Served:
    """`stagetrail ui` serving the stocked store."""
    served: Served = serve(stocked.url)
    return served


@pytest.fixture(scope="module")
def engine(stocked: Stocked) -> Iterator[Engine]:
    """The stocked store, for the expected answers."""
    with Engine(stocked.url, create=False) as opened:
        yield opened


COUNT_ADDRESS_WRITES = """() => {
  window.addressWrites = [];
  const write = history.replaceState.bind(history);
  history.replaceState = function (state, unused, address) {
    window.addressWrites.push(address);
    write(state, unused, address);
  };
}"""
"""Playwright: record every address the page writes from now on."""


HOLD_ADDRESS_TIMER = """() => {
  const start = window.setTimeout.bind(window);
  window.setTimeout = (callback, delay, ...rest) =>
    delay === 300 ? 0 : start(callback, delay, ...rest);
}"""
"""Playwright: the page's 300 ms timers never fire (the slider never rests), other timers do.
(Playwright's clock would do, but it hides the navigation's type from the page.)"""


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
        page.clock.install()
        page.goto(f"{viewer.base}/runs/{run_id}?at=2")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        page.clock.pause_at(page.evaluate("() => Date.now()") + 1000)  # time flows no more
        page.evaluate(COUNT_ADDRESS_WRITES)
        move_slider(page, 5)
        assert page.evaluate("() => window.addressWrites") == []
        page.evaluate("() => window.dispatchEvent(new FocusEvent('blur'))")
        assert page.evaluate("() => window.addressWrites") == ["?at=5"]
        assert page.url == f"{viewer.base}/runs/{run_id}?at=5"
