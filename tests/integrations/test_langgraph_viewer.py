"""A LangGraph thread in the viewer, in a real browser: what nodes wrote, readable (the
screenshot docs/langgraph.md shows is taken here; UPDATE_DOCS=1 retakes it)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="needs the langgraph extra")
pytest.importorskip("playwright", reason="needs the ui extra")

from langchain_core.runnables import RunnableConfig

from engine import Engine
from engine.integrations.langgraph import StagetrailSaver
from engine.ui.report import write_report
from tests.integrations.test_attempts import retried_graph
from tests.ui import conftest as ui

browser = ui.browser
"""The viewer tests' headless Chromium, as a fixture of this module too."""
serve = ui.serve
"""The viewer tests' `stagetrail ui` server, as a fixture of this module too."""

ROOT = Path(__file__).resolve().parents[2]
SHOT = ROOT / "docs" / "langgraph-run.png"
PNG = b"\x89PNG\r\n\x1a\n"


def record(directory: Path) -> tuple[str, Any]:
    """A store with one thread: fetch retried twice by RetryPolicy; its URL and run id."""
    url = f"sqlite:///{directory / 'graph.db'}"
    with Engine(url) as engine:
        graph = retried_graph(failures=2).compile(checkpointer=StagetrailSaver(engine))
        config: RunnableConfig = {"configurable": {"thread_id": "order-7"}}
        graph.invoke({"log": []}, config, durability="sync")
        (summary,) = engine.runs()
    return url, summary.run_id


STACK = ["__graph__", "plan", *["__graph__", "fetch"] * 3]
"""The thread's stack, oldest first: each node run's route (implicit) and its outcome."""


def stack_stages(page: Any) -> list[str]:
    """The stage of each row of the page's stack panel, oldest first."""
    stages = "rows => rows.map(r => r.children[3].textContent)"
    return list(page.eval_on_selector_all("#stack tbody tr", stages))


@pytest.mark.browser
class TestViewer:
    def test_the_run_page_shows_attempts_and_values(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> None:
        """The run page lists each attempt and retry, what nodes wrote, and no stored bytes."""
        url, run_id = record(tmp_path)
        served = request.getfixturevalue("serve")(url)
        page = request.getfixturevalue("browser").new_page()
        page.set_viewport_size({"width": 1280, "height": 1400})
        page.goto(f"{served.base}/runs/{run_id}")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        events = page.inner_text("#events")
        assert "RetryScheduled" in events
        assert "ConnectionError" in events
        assert 'wrote log=["fetch"]' in events
        assert "step 0 (loop)" in events
        assert "kbVm" not in page.content()
        assert not re.search(r'"msgpack", "[A-Za-z0-9+/=]{16,}', page.content())
        titles = "els => els.map(e => e.querySelector('title').textContent)"
        rows = page.eval_on_selector_all("#gantt-box .row-label", titles)
        assert sorted(rows) == ["fetch", "plan"]  # a row per node: LangGraph's hub has none
        status = page.inner_text("#current-status")
        assert status == "idle"
        assert stack_stages(page) == STACK  # a row per frame, two made from each outcome
        if os.environ.get("UPDATE_DOCS") == "1":
            page.screenshot(path=str(SHOT), full_page=True)
        page.close()
        shown = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (ROOT / "docs" / "langgraph.md").read_text())
        assert shown == [SHOT.name]
        assert SHOT.read_bytes().startswith(PNG)

    def test_the_report_lists_each_route_and_outcome_frame(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> None:
        """The offline report's stack shows a row per frame: an implicit route's and its node's,
        though both are made from one event."""
        url, run_id = record(tmp_path)
        path = tmp_path / "thread.html"
        with Engine(url) as engine:
            write_report(engine, run_id, path)
        page = request.getfixturevalue("browser").new_page()
        page.goto(path.as_uri())
        page.wait_for_selector("body[data-ready='1']", state="attached")
        assert stack_stages(page) == STACK
        page.close()
