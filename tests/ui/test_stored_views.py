"""The viewer's stored views (`RunView` snapshots): restored as a full fold would make them."""

from __future__ import annotations

import contextlib
import random
import sqlite3
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from engine import Engine
from engine.cli.demo.code_review import REVIEW, BuildException
from engine.ui.snapshot import RunView
from events import JSON, RetryScheduled
from projections.deferred import unpack_ranges


def record_loops(url: str, cycles: int) -> UUID:
    """A review looping `cycles` times through a failed build, its retry, a build and a failed
    test (every 10th undone and run again), as benchmarks/ui.py records, 7-10 events a loop."""
    with Engine(url) as engine:
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", {"project_type": "python"})
        run.stage_completed("code_review", {"critical": 3})
        with run.batch():
            for cycle in range(cycles):
                run.stage_started("developer")
                run.stage_failed("developer", BuildException(f"compile error #{cycle}"))
                attempt = (run.machine.open_attempt or 0) + 1
                run.record(RetryScheduled, stage="developer", attempt=attempt, delay=2.0, reason="b")
                run.stage_started("developer")
                run.stage_completed("developer", {"changed_files": cycle % 7})
                run.stage_started("testing")
                run.stage_failed("testing", f"test_{cycle} failed", error_type="TestFailure")
                if cycle % 10 == 9:
                    run.rollback(1, reason="flaky test")
                    run.stage_started("testing")
                    run.stage_failed("testing", f"test_{cycle} failed", error_type="TestFailure")
        return run.id


def stored_views(url: str) -> list[tuple[int, JSON]]:
    """Every stored `RunView` snapshot of the store, unsealed, oldest first."""
    path = url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute(
            "SELECT version, state FROM stagetrail_snapshots WHERE projection = ? ORDER BY version",
            (RunView.name,),
        ).fetchall()
    with Engine(url, create=False) as engine:
        return [(version, engine.store.views.codec.unseal(state)) for version, state in rows]


def reader(engine: Engine, run_id: UUID) -> Any:
    """The run's events `(gt, lte)`, as a restored view reads its older items."""

    def events(gt: int, lte: int) -> Iterator[Any]:
        return iter(engine.store.read(run_id, gt=gt, lte=lte))

    return events


def recounted(data: JSON) -> JSON:
    """`data` as the code before stored totals wrote it: the ranges alone (totals summed)."""
    summary, stack, results, *rest = data
    stack = {key: value for key, value in stack.items() if key not in ("last", "count")}
    return [summary, stack, [row[:3] for row in results], *rest]


class TestStoredViews:
    def test_a_restored_view_equals_a_full_fold_at_random_versions(self, sqlite_url: str) -> None:
        """A fresh engine answers at random versions from the stored views (their totals as
        stored) exactly what folding the run from its first event gives."""
        run_id = record_loops(sqlite_url, 900)
        with Engine(sqlite_url) as engine:
            last = engine.store.last(run_id)
            assert last is not None
            engine.project(run_id, RunView, at=last.version)  # stores the views
        assert stored_views(sqlite_url)
        with Engine(sqlite_url, create=False) as fresh:
            events = fresh.events(run_id)
            for at in random.Random(11).sample(range(1, last.version + 1), 8):
                assert fresh.project(run_id, RunView, at=at) == RunView().fold(events[:at]), at

    def test_stored_totals_restore_what_recounting_restores(self, sqlite_url: str) -> None:
        """Differential: each stored view restored with its totals (new) and with its ranges
        alone, the totals summed from the text (the restore before), gives equal states,
        and the stored totals are the recounted ones."""
        run_id = record_loops(sqlite_url, 900)
        with Engine(sqlite_url) as engine:
            engine.project(run_id, RunView)
        views = stored_views(sqlite_url)
        assert len(views) >= 3
        with Engine(sqlite_url, create=False) as engine:
            events, view = reader(engine, run_id), RunView()
            for _, data in views:
                stack, results = data[1], data[2]
                whole = unpack_ranges(stack["ranges"])
                assert (stack["last"], stack["count"]) == (whole.last, whole.versions)
                for _, ranges, _, last, count in results:
                    assert (last, count) == (unpack_ranges(ranges).last, unpack_ranges(ranges).versions)
                assert view.restore(data, events) == view.restore(recounted(data), events)

    def test_a_stored_view_round_trips_through_the_stores_serializer(
        self, sqlite_url: str
    ) -> None:
        """A view restored from its sealed bytes snapshots again to the very same JSON (its
        older items not made), and sealing that gives the same bytes."""
        run_id = record_loops(sqlite_url, 400)
        with Engine(sqlite_url) as engine:
            engine.project(run_id, RunView)
        with Engine(sqlite_url, create=False) as engine:
            codec, view = engine.store.views.codec, RunView()
            for _, data in stored_views(sqlite_url):
                restored = view.restore(data, reader(engine, run_id))
                assert view.snapshot(restored) == data
                assert codec.unseal(codec.seal(view.snapshot(restored))) == data
