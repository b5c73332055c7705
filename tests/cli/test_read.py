"""The read commands — runs, show, state, replay, diff — on SQLite and PostgreSQL stores."""

from __future__ import annotations

import pytest

from engine import Engine
from engine.cli.demo.coordinator import FEATURE_CHECK
from projections import BUILT_INS, StateStack
from tests._helpers import hub_history
from tests.cli._helpers import Filled, as_json, fails, fill, json_lines, ok


@pytest.fixture(params=["sqlite_url", "postgres_url"])
def filled(request: pytest.FixtureRequest) -> Filled:
    """A SQLite file or a PostgreSQL schema holding the examples' runs."""
    return fill(request.getfixturevalue(request.param))


class TestRuns:
    def test_table_lists_every_run_newest_first(self, filled: Filled) -> None:
        """The table has a header and one row per run, the newest (the fork) on top."""
        lines = ok("runs", "--store", filled.url).splitlines()
        assert lines[0].split() == [
            "run",
            "pipeline",
            "status",
            "state",
            "started",
            "duration",
            "attempts",
            "failures",
        ]
        assert len(lines) == 6
        assert lines[1].startswith(str(filled.fork)[:8])
        assert lines[-1].startswith(str(filled.clean)[:8])

    def test_json_has_the_documented_fields(self, filled: Filled) -> None:
        """--json prints an array of objects with the stable field names."""
        rows = as_json("runs", "--store", filled.url)
        assert [row["run_id"] for row in rows][-1] == str(filled.clean)
        fields = {"run_id", "pipeline", "status", "state", "started", "finished"}
        fields |= {"attempts", "failures", "labels"}
        assert all(fields <= set(row) for row in rows)
        retried = next(row for row in rows if row["run_id"] == str(filled.retried))
        assert (retried["attempts"], retried["failures"], retried["state"]) == (8, 3, "done")

    def test_filters_combine(self, filled: Filled) -> None:
        """--status, --label, --pipeline and --limit narrow the list."""
        url = filled.url
        failed = as_json("runs", "--store", url, "--status", "failed")
        assert [row["run_id"] for row in failed] == [str(filled.abandoned)]
        core = as_json("runs", "--store", url, "--label", "team=core", "--pipeline", "code-review")
        assert [row["run_id"] for row in core] == [str(filled.busy)]
        assert len(as_json("runs", "--store", url, "--limit", "2")) == 2

    def test_since_takes_times_and_spans(self, filled: Filled) -> None:
        """--since accepts ISO 8601 and spans ago; a future time matches nothing."""
        assert len(as_json("runs", "--store", filled.url, "--since", "1h")) == 5
        assert as_json("runs", "--store", filled.url, "--since", "2999-01-01T00:00:00Z") == []
        out = ok("runs", "--store", filled.url, "--since", "2999-01-01")
        assert out == "No runs match.\n"

    def test_bad_filters_are_one_line_errors(self, filled: Filled) -> None:
        """An unknown status, a label without '=' and a bad time exit 2 with one line."""
        assert "status" in fails("runs", "--store", filled.url, "--status", "nope")
        assert "key=value" in fails("runs", "--store", filled.url, "--label", "team")
        assert "--since 'soon'" in fails("runs", "--store", filled.url, "--since", "soon")


class TestShow:
    def test_one_line_per_event_and_the_status(self, filled: Filled) -> None:
        """The timeline has a line per event and ends with the status and reason."""
        lines = ok("show", str(filled.abandoned)[:6], "--store", filled.url).splitlines()
        events = [line for line in lines if line[:3].strip("* ").isdigit()]
        assert len(events) == 8
        assert "BuildException: linker error #1" in events[3]
        assert lines[-3].startswith("status: failed (state aborted, 8 events, 6 attempts")
        assert lines[-1] == "  build failed 3 times"

    def test_decisions_are_marked(self, filled: Filled) -> None:
        """RetryScheduled, CircuitOpened, StateRolledBack and RunFinished lines start with '*'."""
        lines = ok("show", str(filled.busy), "--store", filled.url).splitlines()
        marked = [line[1:].split()[2] for line in lines if line.startswith("*")]
        assert marked == ["StateRolledBack", "RetryScheduled", "CircuitOpened", "RunFinished"]
        assert any("attempt 2 in 2.0s: timeout" in line for line in lines)

    def test_structured_reason_is_readable(self, filled: Filled) -> None:
        """A JSON reason is shown one field per line."""
        out = ok("show", str(filled.busy), "--store", filled.url)
        assert out.endswith(
            'reason:\n  rule: max_same_error\n  signatures: ["test_empty"]\n  steps: 12\n'
        )

    def test_json_lines_one_event_each(self, filled: Filled) -> None:
        """--json streams one object per event with its fields and a decision flag."""
        rows = json_lines("show", str(filled.busy), "--store", filled.url)
        assert [row["version"] for row in rows] == list(range(1, len(rows) + 1))
        assert rows[0]["event"] == "RunStarted"
        assert rows[0]["labels"] == {"team": "core"}
        assert rows[-1]["reason"]["rule"] == "max_same_error"
        assert [row["event"] for row in rows if row["decision"]] == [
            "StateRolledBack",
            "RetryScheduled",
            "CircuitOpened",
            "RunFinished",
        ]


class TestState:
    def test_stack_at_a_version(self, filled: Filled) -> None:
        """--at 8 shows the stack after the second build failure."""
        out = ok("state", str(filled.retried), "--at", "8", "--store", filled.url)
        assert "after event 8 of 17" in out
        assert "current state: developer, depth 4" in out
        assert "BuildException: compile error #2" in out.splitlines()[-1]

    def test_version_0_is_before_the_first_event(self, filled: Filled) -> None:
        """--at 0 says it is the point before the run's first event, not `current state: None`."""
        out = ok("state", str(filled.retried), "--at", "0", "--store", filled.url)
        lines = out.splitlines()
        assert lines[0].endswith("at version 0 of 17: before its first event")
        assert (
            lines[1]
            == "no state yet: the run had not started (its first event, RunStarted, starts it)"
        )
        assert "None" not in out

    def test_stack_at_a_time(self, filled: Filled) -> None:
        """--at with a time folds the events recorded at or before it."""
        with Engine(filled.url, create=False) as engine:
            moment = engine.events(filled.retried)[7].timestamp.isoformat()
        data = as_json("state", str(filled.retried), "--at", moment, "--store", filled.url)
        assert data["version"] >= 8
        assert data["state"]["frames"][3][6] == "compile error #2"

    @pytest.mark.parametrize("name", sorted(cls.name for cls in BUILT_INS))
    def test_every_builtin_by_name(self, filled: Filled, name: str) -> None:
        """Each built-in projection is found by its name, in text and in JSON."""
        data = as_json("state", str(filled.busy), "--projection", name, "--store", filled.url)
        assert (data["projection"], data["version"]) == (name, data["last_version"])
        assert f"{name} of run" in ok(
            "state", str(filled.busy), "--projection", name, "--store", filled.url
        )

    def test_projection_from_module_attr(self, filled: Filled) -> None:
        """--projection module:attr imports a projection class."""
        data = as_json(
            "state",
            str(filled.retried),
            "--projection",
            "projections:RetryCounts",
            "--store",
            filled.url,
        )
        assert data["state"]["retry_counts"] == {"developer": 2, "testing": 1}

    def test_unknown_projection_and_bad_at(self, filled: Filled) -> None:
        """An unknown name, a bad --at and a negative --at are one-line errors."""
        run = str(filled.retried)
        assert "no projection named 'nope'" in fails(
            "state", run, "--projection", "nope", "--store", filled.url
        )
        assert "--at 'yesterday'" in fails("state", run, "--at", "yesterday", "--store", filled.url)
        assert "int >= 0" in fails("state", run, "--at", "-3", "--store", filled.url)


@pytest.fixture(params=["sqlite_url", "postgres_url"])
def demo_url(request: pytest.FixtureRequest) -> str:
    """A SQLite file or a PostgreSQL schema holding what `stagetrail demo` records."""
    url: str = request.getfixturevalue(request.param)
    ok("demo", "--store", url)
    return url


def coordinator_run(url: str) -> str:
    """The id of the demo's coordinator run, the parent of two child runs."""
    (row,) = as_json("runs", "--pipeline", "coordinator", "--store", url)
    return str(row["run_id"])


class TestStateTree:
    def test_task_table_across_the_child_runs(self, demo_url: str) -> None:
        """--tree folds the coordinator's child runs into its task table; the header says so."""
        run = coordinator_run(demo_url)
        children = {
            row["run_id"]
            for row in as_json("runs", "--pipeline", "feature-check", "--store", demo_url)
        }
        alone = as_json("state", run, "--projection", "task_table", "--store", demo_url)
        tree = as_json("state", run, "--projection", "task_table", "--tree", "--store", demo_url)
        assert alone["state"]["runs"] == [run]
        assert set(tree["state"]["runs"]) == {run, *children}
        members = [row["run_id"] for row in tree["runs"]]
        assert (members[0], set(members)) == (run, {run, *children})
        assert all(row["version"] == row["last_version"] for row in tree["runs"])
        assert (tree["projection"], tree["tree"], tree["at"]) == ("task_table", True, None)
        assert tree["state"]["budget"] == alone["state"]["budget"] == {"usd": 1.0}
        out = ok("state", run[:8], "--projection", "task_table", "--tree", "--store", demo_url)
        total = sum(row["last_version"] for row in tree["runs"])
        assert out.splitlines()[0] == (
            f"task_table of the tree of run {run[:8]} (3 runs), after {total} of {total} events"
        )

    def test_tasks_of_a_child_run_are_in_the_tree_only(self, demo_url: str) -> None:
        """A task recorded in a child run is listed with --tree, not in the root's own table."""
        run = coordinator_run(demo_url)
        with Engine(demo_url, create=False) as engine:
            child = engine.start_run(FEATURE_CHECK, parent=engine.load(run))
            child.add_task("task-docs")
        args = ("state", run, "--projection", "task_table", "--store", demo_url)
        alone = [task["task_id"] for task in as_json(*args)["state"]["tasks"]]
        tree = [task["task_id"] for task in as_json(*args, "--tree")["state"]["tasks"]]
        assert len(tree) == len(alone) + 1
        assert tree[-1] == "task-docs"
        assert "task-docs" not in alone

    def test_at_a_time_folds_each_run_up_to_it(self, demo_url: str) -> None:
        """--tree --at TIME folds each run's events at or before the time."""
        run = coordinator_run(demo_url)
        with Engine(demo_url, create=False) as engine:
            moment = engine.events(run)[0].timestamp
        args = ("state", run, "--projection", "task_table", "--tree", "--store", demo_url)
        data = as_json(*args, "--at", moment.isoformat())
        assert data["at"] == moment.isoformat()
        assert [row["version"] for row in data["runs"]] == [1, 0, 0]
        assert (data["state"]["tasks"], data["state"]["runs"]) == ([], [run])
        assert "(3 runs) at " in ok(*args, "--at", moment.isoformat()).splitlines()[0]

    def test_a_version_at_is_refused(self, demo_url: str) -> None:
        """--tree with --at N is a one-line error: versions are per run, give a time."""
        error = fails(
            "state", coordinator_run(demo_url), "--at", "3", "--tree", "--store", demo_url
        )
        assert "--at '3': with --tree, give a time" in error


class TestReplay:
    def test_shows_what_each_event_changed(self, filled: Filled) -> None:
        """Each outcome shows the state change and the frame pushed; rollbacks the pop."""
        out = ok("replay", str(filled.busy), "--to", "5", "--store", filled.url)
        assert "state   project_analysis -> code_review" in out
        assert "stack   push code_review (project_analysis completed #1), depth 1" in out
        assert "stack   pop developer (code_review completed #1), depth 1" in out

    def test_json_from_to(self, filled: Filled) -> None:
        """--from/--to bound the steps; each step has before/after state and depth."""
        rows = json_lines(
            "replay", str(filled.retried), "--from", "10", "--to", "12", "--store", filled.url
        )
        assert [row["version"] for row in rows] == [10, 11, 12]
        assert rows[0]["state"] == ["developer", "testing"]
        assert rows[0]["depth"] == [4, 5]
        assert rows[2]["pushed"]["state"] == "developer"
        assert rows[1]["pushed"] is None

    def test_json_frames_pushed_and_popped_rebuild_the_stack(self, sqlite_url: str) -> None:
        """Each step's pushed_frames and popped, applied in turn, give the run's stack:
        an outcome that took a hub's implicit route pushed the route's frame too."""
        with Engine(sqlite_url) as engine:
            run = hub_history(engine, explicit=False)
            run.rollback(3)  # b_done's, b's outcome, the route b's outcome took
            run.stage_completed("b")
            frames = engine.project(run.id, StateStack).frames
        mirror: list[dict[str, object]] = []
        for row in json_lines("replay", str(run.id), "--store", sqlite_url):
            del mirror[len(mirror) - len(row["popped"]) :]
            mirror += row["pushed_frames"]
            assert len(mirror) == row["depth"][1]
        assert [(f["version"], f["stage"]) for f in mirror] == [
            (frame.version, frame.stage) for frame in frames
        ]
        assert [f["stage"] for f in mirror].count("hub") == 3  # a's, b's (failed), b's again

    def test_from_after_to_is_an_error(self, filled: Filled) -> None:
        """--from past --to is refused with one line."""
        assert "--from 9" in fails(
            "replay", str(filled.retried), "--from", "9", "--to", "3", "--store", filled.url
        )


class TestDiff:
    def test_two_points_of_a_run(self, filled: Filled) -> None:
        """Between versions 8 and 17: the events in between and what changed."""
        data = as_json(
            "diff", str(filled.retried), "--from", "8", "--to", "17", "--store", filled.url
        )
        changed = {row["key"]: (row["a"], row["b"]) for row in data["differences"]}
        assert changed["state"] == ("developer", "done")
        assert changed["status"] == ("running", "succeeded")
        assert data["events_between"]["RunFinished"] == 1
        assert data["common_frames"] == 4

    def test_a_fork_and_its_origin(self, filled: Filled) -> None:
        """A fork shares its first events with its origin; the texts say so."""
        out = ok("diff", str(filled.retried), str(filled.fork), "--store", filled.url)
        assert "history: the first 3 events are the same" in out
        data = as_json("diff", str(filled.retried), str(filled.fork), "--store", filled.url)
        assert data["common_events"] == 3
        changed = {row["key"]: (row["a"], row["b"]) for row in data["differences"]}
        assert changed["retries of developer"] == (2, 0)

    def test_one_run_needs_from(self, filled: Filled) -> None:
        """A single run without --from is an error, as are points given for two runs."""
        assert "--from" in fails("diff", str(filled.retried), "--store", filled.url)
        assert "two runs" in fails(
            "diff", str(filled.retried), str(filled.fork), "--to", "3", "--store", filled.url
        )


class TestEveryExample:
    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    def test_every_command_reads_every_demo_run(
        self, backend: str, request: pytest.FixtureRequest
    ) -> None:
        """After `stagetrail demo`, each read command works on each recorded run, text and JSON."""
        url = request.getfixturevalue(backend)
        ok("demo", "--store", url)
        summaries = as_json("runs", "--store", url)
        assert {row["status"] for row in summaries} >= {"succeeded", "failed"}
        for row in summaries:
            run = row["run_id"]
            lines = json_lines("show", run, "--store", url)
            assert len(lines) == row["version"]
            assert f"status: {row['status']}" in ok("show", run[:10], "--store", url)
            assert as_json("state", run, "--store", url)["version"] == row["version"]
            steps = json_lines("replay", run, "--store", url)
            assert steps[-1]["state"][1] == row["state"]
            assert ok("replay", run, "--store", url).startswith(f"run {run}")
            assert as_json("verify", run, "--store", url)["ok"] is True
            assert "stateDiagram-v2" in ok("diagram", run, "--store", url)
