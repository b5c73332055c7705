"""fork, verify, diagram, projections, run id prefixes and terminal output, on both SQL stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from engine import Engine
from engine.cli.demo.code_review import REVIEW
from events import RunStarted, StageCompleted
from tests.cli._helpers import Filled, as_json, fails, fill, invoke, ok


@pytest.fixture(params=["sqlite_url", "postgres_url"])
def filled(request: pytest.FixtureRequest) -> Filled:
    """A SQLite file or a PostgreSQL schema holding the examples' runs."""
    return fill(request.getfixturevalue(request.param))


class TestFork:
    def test_fork_makes_a_run_with_lineage(self, filled: Filled) -> None:
        """fork --json names the new run, which starts with the copied events."""
        data = as_json("fork", str(filled.retried)[:8], "--at", "4", "--store", filled.url)
        assert data["forked_from"] == [str(filled.retried), 4]
        assert (data["state"], data["version"]) == ("developer", 4)
        with Engine(filled.url, create=False) as engine:
            first = engine.events(data["run_id"])[0]
        assert isinstance(first, RunStarted)
        assert first.forked_from == (filled.retried, 4)

    def test_fork_text_and_refusals(self, filled: Filled) -> None:
        """The text names the new run; forking at the RunFinished is refused."""
        assert "forked run" in ok("fork", str(filled.clean), "--at", "2", "--store", filled.url)
        assert "RunFinished" in fails("fork", str(filled.clean), "--at", "9", "--store", filled.url)


class TestVerify:
    def test_a_sound_run_exits_0(self, filled: Filled) -> None:
        """A recorded run verifies with no problems."""
        assert "17 events, no problems" in ok("verify", str(filled.retried), "--store", filled.url)
        data = as_json("verify", str(filled.busy), "--store", filled.url)
        assert data["ok"] is True
        assert data["problems"] == []

    def test_problems_exit_1(self, filled: Filled) -> None:
        """An event appended around the rules is reported, and the exit code is 1."""
        with Engine(filled.url) as engine:
            run = engine.start_run(REVIEW)
            engine.store.append(
                [StageCompleted(run_id=run.id, version=2, stage="testing", attempt=1)]
            )
        text = invoke("verify", str(run.id), "--store", filled.url)
        assert text.exit_code == 1
        assert "transition" in text.stdout
        assert "not the current state 'project_analysis'" in text.stdout
        data = invoke("verify", str(run.id), "--store", filled.url, "--json")
        assert data.exit_code == 1
        assert '"ok": false' in data.stdout


class TestDiagram:
    def test_a_run_is_drawn_from_its_recorded_table(self, filled: Filled) -> None:
        """The run's stored table is drawn with transitions, its current state highlighted."""
        out = ok("diagram", str(filled.abandoned), "--store", filled.url)
        assert out == REVIEW.to_mermaid("aborted").rstrip("\n") + "\n"
        assert "Class aborted s_active" in out
        assert out.rstrip().endswith("[*] --> project_analysis")
        dot = ok("diagram", str(filled.abandoned), "--format", "dot", "--store", filled.url)
        assert dot == REVIEW.to_dot("aborted").rstrip("\n") + "\n"

    def test_a_pipeline_by_module_attr(self) -> None:
        """module:attr names a Pipeline; anything else there is a one-line error."""
        out = ok("diagram", "engine.cli.demo.code_review:REVIEW", "--format", "dot")
        assert out.startswith('digraph "code-review" {')
        assert "is not a Pipeline" in fails("diagram", "engine.cli.demo.code_review:record_all")
        assert "cannot import" in fails("diagram", "engine.cli.demo.nowhere:REVIEW")

    def test_a_module_that_fails_on_import_is_one_line(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A module raising anything on import (here a SyntaxError) is a one-line error."""
        (tmp_path / "broken_pipeline.py").write_text("REVIEW = (\n")
        monkeypatch.chdir(tmp_path)
        message = fails("diagram", "broken_pipeline:REVIEW")
        assert "cannot import broken_pipeline: SyntaxError" in message


class TestProjections:
    def test_list_names_the_builtins(self, filled: Filled) -> None:
        """list shows every built-in, and which ones the store keeps."""
        rows = {row["name"]: row for row in as_json("projections", "list", "--store", filled.url)}
        assert {"state_stack", "stage_results", "retry_counts", "task_table"} <= set(rows)
        assert rows["run_index"]["persistent"] is True
        assert rows["state_stack"]["persistent"] is False
        assert "failure_patterns" in ok("projections", "list", "--store", filled.url)

    def test_status_shows_lag_and_rebuild_clears_it(self, filled: Filled) -> None:
        """failure_patterns lags until rebuilt; rebuild folds every event."""
        before = {s["name"]: s for s in as_json("projections", "status", "--store", filled.url)}
        head = before["failure_patterns"]["head"]
        assert before["failure_patterns"]["lag"] == head > 0
        done = as_json("projections", "rebuild", "failure_patterns", "--store", filled.url)
        assert done == {"name": "failure_patterns", "events": head, "position": head}
        after = {s["name"]: s for s in as_json("projections", "status", "--store", filled.url)}
        assert after["failure_patterns"]["lag"] == 0
        assert "failure_patterns" in ok("projections", "status", "--store", filled.url)

    def test_rebuild_a_builtin_that_was_not_kept(self, filled: Filled) -> None:
        """Rebuilding state_stack makes the store keep it."""
        out = ok("projections", "rebuild", "state_stack", "--store", filled.url)
        assert out.startswith("rebuilt state_stack: ")
        rows = {row["name"]: row for row in as_json("projections", "list", "--store", filled.url)}
        assert rows["state_stack"]["persistent"] is True
        assert "no projection named 'nope'" in fails(
            "projections", "rebuild", "nope", "--store", filled.url
        )


class TestRunIds:
    def test_prefixes_full_ids_and_ambiguity(self, sqlite_url: str) -> None:
        """A unique prefix (with or without hyphens) works; a shared one is ambiguous."""
        first = UUID("abcdef01-2345-4000-8000-000000000001")
        second = UUID("abcdef01-2345-4000-8000-000000000002")
        with Engine(sqlite_url) as engine:
            engine.start_run(REVIEW, run_id=first)
            engine.start_run(REVIEW, run_id=second)
        error = fails("show", "abcdef", "--store", sqlite_url)
        assert "ambiguous" in error
        assert "abcdef01-2345" in error
        assert str(first) in ok("show", "abcdef01234540008000000000000001", "--store", sqlite_url)
        assert str(second) in ok("show", str(second).upper(), "--store", sqlite_url)
        assert "no run 0000" in fails("show", "0000", "--store", sqlite_url)
        assert "no run zz" in fails("show", "zz", "--store", sqlite_url)


class TestTerminal:
    def test_rich_tables_only_on_a_terminal(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Off a terminal the table is plain text; on one it is drawn by rich."""
        fill(sqlite_url)
        assert "─" not in ok("runs", "--store", sqlite_url)
        monkeypatch.setattr("engine.cli.common.stdout_is_terminal", lambda: True)
        assert "─" in ok("runs", "--store", sqlite_url)
        assert "RunFinished" in ok("show", str(fill(sqlite_url).busy), "--store", sqlite_url)


class TestPrefixLookup:
    def test_run_ids_by_prefix_on_every_backend(self, engine: Engine) -> None:
        """Projections.run_ids finds runs by id prefix, across hyphens, in byte order."""
        ids = [
            UUID("abcdef01-2345-4000-8000-000000000002"),
            UUID("abcdef01-2345-4000-8000-000000000001"),
            UUID("abcdef01-9999-4000-8000-000000000001"),
        ]
        for run_id in ids:
            engine.start_run(REVIEW, run_id=run_id)
        assert engine.projections.run_ids("abcdef01-2345") == sorted(ids[:2], key=str)
        assert engine.projections.run_ids("ABCDEF01-9") == [ids[2]]
        assert engine.projections.run_ids("abcdef01", limit=2) == sorted(ids, key=str)[:2]
        assert engine.projections.run_ids("abcdef02") == []

    def test_postgres_prefixes_read_a_byte_order_index(self, postgres_url: str) -> None:
        """On PostgreSQL a prefix lookup is an index range scan, whatever the collation."""
        with Engine(postgres_url) as engine:
            for _ in range(3):
                engine.start_run(REVIEW)
            views: Any = engine.store.views
            sql = (
                f"EXPLAIN SELECT run_id FROM {views.names['runs']} WHERE "
                f"{views.prefix_match.replace('?', '%s')} ORDER BY {views.prefix_order} LIMIT 3"
            )
            with views.datastore.transaction(commit=False) as cursor:
                cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table: ask for the index
                # Statistics, as autovacuum keeps them: without any the planner guesses the
                # row count from the row width, and a narrow table's guess favours a sort.
                cursor.execute(f"ANALYZE {views.names['runs']}")
                cursor.execute(sql, ("ab", "ab~"))
                plan = " ".join(row["QUERY PLAN"] for row in cursor.fetchall())
        assert "stagetrail_runs_id_bytes" in plan
        assert "Sort" not in plan


class TestRetain:
    def test_dry_run_lists_and_writes_nothing(self, filled: Filled) -> None:
        """retain without --apply prints the chosen runs with their rule and deletes none."""
        with Engine(filled.url, create=False) as engine:
            status = engine.load(filled.abandoned).status
        data = as_json("retain", "--rule", f"status={status}", "--store", filled.url)
        assert data["applied"] is False
        assert [run["run_id"] for run in data["runs"]] == [str(filled.abandoned)]
        assert data["runs"][0]["rule"]["status"] == [status]
        text = ok("retain", "--rule", f"status={status}", "--store", filled.url)
        assert text.startswith("would delete 1 run(s) (dry run; --apply)")
        assert f"rule status={status}" in text
        with Engine(filled.url, create=False) as engine:
            assert engine.load(filled.abandoned).status == status

    def test_apply_deletes_and_compacts(self, filled: Filled) -> None:
        """retain --apply erases the chosen runs; the others stay."""
        with Engine(filled.url, create=False) as engine:
            status = engine.load(filled.abandoned).status
        data = as_json("retain", "--rule", f"status={status}", "--apply", "--store", filled.url)
        assert data["applied"] is True
        assert data["events_removed"] > 0
        with Engine(filled.url, create=False) as engine:
            assert filled.abandoned not in {s.run_id for s in engine.runs(limit=100)}
            assert engine.verify(filled.clean).ok

    def test_a_bad_rule_is_one_error_line(self, filled: Filled) -> None:
        """An unknown key in a rule is refused by name, nothing written."""
        assert "unknown key 'colour'" in fails(
            "retain", "--rule", "colour=red", "--store", filled.url
        )
