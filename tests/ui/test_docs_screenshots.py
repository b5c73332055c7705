"""docs/ui.md's screenshots are taken by this test from the demo (UPDATE_DOCS=1 retakes them)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from engine import Engine
from engine.cli.demo.record import record_all
from engine.ui import write_report
from tests.ui._helpers import move_slider

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "ui.md"
SHOTS = ("ui-runs.png", "ui-run.png", "ui-report.png")
PNG = b"\x89PNG\r\n\x1a\n"


def retake(browser: Any, serve: Any, directory: Path) -> None:
    """Record the demo, serve it, and screenshot the runs page, a run page and its report."""
    url = f"sqlite:///{directory / 'demo.db'}"
    with Engine(url) as engine:
        record_all(engine)
        breaker = engine.runs(label="example=supervised-review")[0]  # the breaker's cycle
        write_report(engine, breaker.run_id, directory / "report.html")
    served = serve(url)
    page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(served.base + "/")
    page.screenshot(path=str(ROOT / "docs" / SHOTS[0]), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 1800})  # all of it on screen, as scrolled to
    page.goto(f"{served.base}/runs/{breaker.run_id}")
    page.wait_for_selector("body[data-ready='1']", state="attached")
    move_slider(page, 12)
    page.screenshot(path=str(ROOT / "docs" / SHOTS[1]), full_page=True)
    page.goto((directory / "report.html").as_uri())
    page.wait_for_selector("body[data-ready='1']", state="attached")
    move_slider(page, 6)
    page.click("#ev-5 summary")
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(ROOT / "docs" / SHOTS[2]), full_page=True)
    page.close()


class TestScreenshots:
    @pytest.mark.browser
    def test_docs_screenshots_exist_and_are_shown(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> None:
        """Each screenshot is a PNG in docs/ that docs/ui.md shows (UPDATE_DOCS=1 retakes them)."""
        if os.environ.get("UPDATE_DOCS") == "1":
            retake(request.getfixturevalue("browser"), request.getfixturevalue("serve"), tmp_path)
        shown = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", PAGE.read_text())
        assert shown == list(SHOTS)
        for name in SHOTS:
            assert (ROOT / "docs" / name).read_bytes().startswith(PNG), name
