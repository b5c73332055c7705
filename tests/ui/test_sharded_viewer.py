"""`stagetrail ui` over a ``shards:`` URL: one viewer for the runs of several stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from starlette.testclient import TestClient

from engine.cli.demo.code_review import REVIEW, record_review
from engine.sharded import ShardedEngine
from engine.ui import create_app
from tests.test_sharded import id_in, key_in, layout_file
from tests.ui.conftest import Served


@attrs.frozen
class Spread:
    """A served sharded store: a parent in shard a, its child in shard b, a review in b."""

    served: Served
    url: str
    parent: str
    child: str
    review: str


@pytest.fixture(scope="module")
def spread(serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Spread:
    """Two SQLite shards with runs in both, served by `stagetrail ui`."""
    folder: Path = tmp_path_factory.mktemp("sharded")
    stores = [f"sqlite:///{folder / 'a.db'}", f"sqlite:///{folder / 'b.db'}"]
    url = layout_file(folder, stores)
    with ShardedEngine(url) as sharded:
        parent = sharded.start_run(REVIEW, run_id=id_in(0))
        child = sharded.child_run(parent, REVIEW, key=key_in(sharded, parent.id, 1))
        child.stage_completed("project_analysis")
        review = record_review(sharded, "C-1", build_failures=1)  # type: ignore[arg-type]
    ids = (str(parent.id), str(child.id), str(review.id))
    return Spread(serve(url), url, *ids)


class TestShardedViewer:
    def test_the_runs_api_lists_both_shards(self, spread: Spread) -> None:
        """/api/runs is the union of the shards, newest first."""
        listed = [run["run_id"] for run in spread.served.get("/api/runs")["runs"]]
        assert listed == [spread.review, spread.child, spread.parent]

    def test_a_run_in_either_shard_is_served(self, spread: Spread) -> None:
        """A run's summary, events and state come from its own shard."""
        answer = spread.served.get(f"/api/runs/{spread.child}")
        assert answer["summary"]["parent_run_id"] == spread.parent
        state = spread.served.get(f"/api/runs/{spread.review}/state?at=3")
        assert state["stack"]["current"] == "code_review"

    def test_a_run_page_and_its_timeline_are_drawn_from_its_shard(self, spread: Spread) -> None:
        """/runs/{id} and /api/runs/{id}/timeline answer for runs of either shard."""
        with TestClient(create_app(spread.url), base_url="http://127.0.0.1") as client:
            for run_id in (spread.child, spread.review):
                page = client.get(f"/runs/{run_id}")
                assert page.status_code == 200, page.text
                assert run_id[:8] in page.text
                timeline = client.get(f"/api/runs/{run_id}/timeline?at=2")
                assert timeline.status_code == 200, timeline.text
                assert timeline.json()["run_id"] == run_id
                assert "<svg" in timeline.json()["svg"]

    @pytest.mark.browser
    def test_the_pages_show_runs_of_both_shards(self, spread: Spread, page: Any) -> None:
        """In a real browser the runs page lists all three runs and a child's page opens."""
        page.goto(spread.served.base + "/")
        shown = page.eval_on_selector_all("tr.run", "rows => rows.map(r => r.dataset.runId)")
        assert shown == [spread.review, spread.child, spread.parent]
        page.goto(f"{spread.served.base}/runs/{spread.child}")
        assert spread.child[:8] in page.title()
