"""The viewer's stored views (`RunView` snapshots): restored as a full fold would make them."""

from __future__ import annotations

import contextlib
import itertools
import random
import sqlite3
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from engine import Engine
from engine.cli.demo.code_review import REVIEW, BuildException
from engine.readside import snapshots
from engine.ui.snapshot import RunView
from events import JSON, RetryScheduled
from projections import ProjectionStateError, deferred, run_index
from projections.deferred import ranges_check, unpack_ranges
from tests._helpers import calls_to


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
                run.record(
                    RetryScheduled, stage="developer", attempt=attempt, delay=2.0, reason="b"
                )
                run.stage_started("developer")
                run.stage_completed("developer", {"changed_files": cycle % 7})
                run.stage_started("testing")
                run.stage_failed("testing", f"test_{cycle} failed", error_type="TestFailure")
                if cycle % 10 == 9:
                    run.rollback(1, reason="flaky test")
                    run.stage_started("testing")
                    run.stage_failed("testing", f"test_{cycle} failed", error_type="TestFailure")
        return run.id


def stored_views(url: str, deltas: bool = False) -> list[tuple[int, JSON]]:
    """Every stored whole `RunView` snapshot of the store (`deltas`: every delta), unsealed,
    oldest first."""
    path = url.removeprefix("sqlite:///")
    tag = RunView().identity() + (snapshots.DELTA_TAG if deltas else "")
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute(
            "SELECT version, state FROM stagetrail_snapshots WHERE projection = ? "
            "AND fingerprint = ? ORDER BY version",
            (RunView.name, tag),
        ).fetchall()
    with Engine(url, create=False) as engine:
        return [(version, engine.store.codec.unseal(state)) for version, state in rows]


def reader(engine: Engine, run_id: UUID) -> Any:
    """The run's events `(gt, lte)`, as a restored view reads its older items."""

    def events(gt: int, lte: int) -> Iterator[Any]:
        return iter(engine.store.read(run_id, gt=gt, lte=lte))

    return events


def recounted(data: JSON) -> JSON:
    """`data` as the code before stored totals wrote it: the ranges alone (totals summed)."""
    summary, stack, results, *rest = data
    stack = {key: value for key, value in stack.items() if key not in ("last", "count", "check")}
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
                assert stack["check"] == ranges_check(stack["ranges"], whole.last, whole.versions)
                for _, ranges, _, last, count, check in results:
                    summed = unpack_ranges(ranges)
                    assert (last, count) == (summed.last, summed.versions)
                    assert check == ranges_check(ranges, last, count)
                assert view.restore(data, events) == view.restore(recounted(data), events)

    def test_a_stored_view_round_trips_through_the_stores_serializer(self, sqlite_url: str) -> None:
        """A view restored from its sealed bytes snapshots again to the very same JSON (its
        older items not made), and sealing that gives the same bytes."""
        run_id = record_loops(sqlite_url, 400)
        with Engine(sqlite_url) as engine:
            engine.project(run_id, RunView)
        with Engine(sqlite_url, create=False) as engine:
            codec, view = engine.store.codec, RunView()
            for _, data in stored_views(sqlite_url):
                restored = view.restore(data, reader(engine, run_id))
                assert view.snapshot(restored) == data
                assert codec.unseal(codec.seal(view.snapshot(restored))) == data

    @pytest.mark.parametrize(("part", "more"), [("count", 1), ("count", -1), ("last", -40)])
    def test_a_stored_view_with_totals_not_its_ranges_is_refused(
        self, sqlite_url: str, part: str, more: int
    ) -> None:
        """A stored view whose stack totals are not those of its ranges (sealed again through
        the store's codec, as a plain store lets anyone) is refused when restored: one
        clear error, never a stack of another depth or of other events."""
        run_id = record_loops(sqlite_url, 400)
        with Engine(sqlite_url) as engine:
            engine.project(run_id, RunView)
        version, data = stored_views(sqlite_url)[-1]
        data[1][part] += more
        path = sqlite_url.removeprefix("sqlite:///")
        with Engine(sqlite_url, create=False) as engine:
            sealed = engine.store.codec.seal(data)
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute(
                "UPDATE stagetrail_snapshots SET state = ? WHERE version = ? AND fingerprint = ?",
                (sealed, version, RunView().identity()),
            )
        with (
            Engine(sqlite_url, create=False) as fresh,
            pytest.raises(ProjectionStateError, match="not those of the ranges"),
        ):
            fresh.project(run_id, RunView, at=version + 1)


class TestViewGap:
    def test_deltas_keep_stored_views_at_most_view_gap_apart_within_the_byte_budget(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Whole views spaced far apart by the byte budget (a tight one here: 8 bytes per event)
        get deltas between them: no two stored views lie more than `VIEW_GAP` apart, every
        delta takes at most the budget for the events since the view before it, and a fresh
        engine restores from a delta exactly what a full fold gives."""
        monkeypatch.setattr(snapshots, "BYTES_PER_EVENT", 8)
        run_id = record_loops(sqlite_url, 2_200)
        with Engine(sqlite_url) as engine:
            last = engine.store.last(run_id)
            assert last is not None
            engine.project(run_id, RunView)
        wholes = [version for version, _ in stored_views(sqlite_url)]
        deltas = stored_views(sqlite_url, deltas=True)
        assert max(b - a for a, b in itertools.pairwise(wholes)) > snapshots.VIEW_GAP
        stored = sorted([*wholes, *(version for version, _ in deltas)])
        assert max(b - a for a, b in itertools.pairwise(stored)) <= snapshots.VIEW_GAP
        assert last.version - stored[-1] < snapshots.VIEW_GAP
        path = sqlite_url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as db:
            sizes = dict(
                db.execute(
                    "SELECT version, length(state) FROM stagetrail_snapshots WHERE fingerprint = ?",
                    (RunView().identity() + snapshots.DELTA_TAG,),
                ).fetchall()
            )
        for version, _ in deltas:
            before = max(v for v in stored if v < version)
            assert sizes[version] <= 8 * (version - before)
        with Engine(sqlite_url, create=False) as fresh:
            events = fresh.events(run_id)
            for version, _ in deltas:
                for at in (version, version + 1, version + 777):
                    assert fresh.project(run_id, RunView, at=at) == RunView().fold(events[:at])

    def test_a_delta_whose_whole_view_is_gone_is_not_used(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A delta whose whole view is missing is passed over: the answer comes from the
        whole view before it, the same as a full fold."""
        monkeypatch.setattr(snapshots, "BYTES_PER_EVENT", 8)
        run_id = record_loops(sqlite_url, 2_200)
        with Engine(sqlite_url) as engine:
            engine.project(run_id, RunView)
        deltas = stored_views(sqlite_url, deltas=True)
        assert deltas
        version, change = deltas[-1]
        path = sqlite_url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("DELETE FROM stagetrail_snapshots WHERE version = ?", (change["base"],))
        with Engine(sqlite_url, create=False) as fresh:
            at = version + 5
            expected = RunView().fold(fresh.events(run_id)[:at])
            assert fresh.project(run_id, RunView, at=at) == expected


class TestErasedRuns:
    def test_a_reused_id_is_served_its_own_run_never_the_erased_ones_deltas(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Once a run with stored deltas is erased and its id given to a new run, a fresh
        engine answers from the new run's events, at the erased run's delta versions too."""
        monkeypatch.setattr(snapshots, "BYTES_PER_EVENT", 8)
        run_id = record_loops(sqlite_url, 2_200)
        with Engine(sqlite_url) as engine:
            engine.project(run_id, RunView)
        deltas = [version for version, _ in stored_views(sqlite_url, deltas=True)]
        assert deltas
        with Engine(sqlite_url) as engine:
            engine.load(run_id).finish("deleted")
            assert engine.compact().runs == (run_id,)
        with Engine(sqlite_url) as engine:
            run = engine.start_run(REVIEW, run_id=run_id)
            with run.batch():
                for cycle in range(3_000):
                    run.stage_completed("project_analysis", {"cycle": cycle})
                    run.rollback(1, reason="again")
        with Engine(sqlite_url, create=False) as fresh:
            events = fresh.events(run_id)
            for at in (deltas[0] + 5, deltas[-1] + 5):
                assert fresh.project(run_id, RunView, at=at) == RunView().fold(events[:at])

    @pytest.mark.parametrize(
        ("module", "cache"),
        [(deferred, "_packed"), (run_index, "_runs")],
        ids=["deferred.packed_versions", "run_index.StateList.runs"],
    )
    def test_an_erased_runs_items_are_let_go_by_a_cache(
        self, sqlite_url: str, module: Any, cache: str
    ) -> None:
        """The packed versions kept for a run's lists (`deferred.packed_versions`) and the runs
        kept for its stacks of states (`run_index.StateList.runs`) hold none of an erased run's
        once another fold reads the store: its items and states are not kept alive."""
        run_id = record_loops(sqlite_url, 600)
        kept = record_loops(sqlite_url, 100)
        with Engine(sqlite_url) as engine:
            engine.project(run_id, RunView)
            held = [cells for cells, *_ in getattr(module, cache).values()]
            assert held
            engine.load(run_id).finish("deleted")
            assert engine.compact().runs == (run_id,)
            engine.project(kept, RunView)
            now = getattr(module, cache).values()
            assert not any(cells is old for cells, *_ in now for old in held)


class _CountedGets(dict[int, Any]):
    """The runs kept by `StateList.runs`, counting the lookups: one per state it walks."""

    gets = 0

    def get(self, key: int, default: Any = None) -> Any:
        _CountedGets.gets += 1
        return super().get(key, default)


class TestFirstLook:
    def test_a_first_fold_of_a_long_run_walks_each_item_a_bounded_number_of_times(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The viewer's first look at a run (one fold storing a view every 500 events) packs
        each frame's and attempt's version, and reads each state of the summary's stack, about
        once, not once per view stored: the fold costs the same per event at any length."""
        run_id = record_loops(sqlite_url, 2_000)
        packed = calls_to(monkeypatch, deferred, "packed_onto")
        monkeypatch.setattr(run_index, "_runs", _CountedGets())
        _CountedGets.gets = 0
        with Engine(sqlite_url, create=False) as engine:
            last = engine.store.last(run_id)
            assert last is not None
            views = last.version // snapshots.SNAPSHOT_INTERVAL
            assert views >= 25
            engine.project(run_id, RunView)
        assert sum(len(versions) for *_, versions in packed) <= 4 * last.version
        assert _CountedGets.gets <= 4 * last.version
