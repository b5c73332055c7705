"""Many writer processes and two followers on one store: every run complete, nothing lost
or doubled, one global order, and persistent projections equal to a clean rebuild.

The workers and followers are real processes (`benchmarks/fleet.py`), started
together against an empty store, so they also race to create it.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any
from uuid import UUID

import pytest

from benchmarks.fleet import start
from engine import Engine
from events import RunFinished, RunStarted
from projections import FailurePatterns, RunIndex, RunSummary

FLEETS = {"postgres_url": (8, 200), "sqlite_url": (4, 200)}
"""Workers and runs per worker on each backend."""
FOLLOWERS = 2
LOCKED = "database is locked"


def run_fleet(url: str, workers: int, runs: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """Start the followers and workers together; wait for the workers, then finish the followers."""
    followers = [start("follower", url) for _ in range(FOLLOWERS)]
    writers = [start("worker", url, "--index", str(i), "--runs", str(runs)) for i in range(workers)]
    written = [writer.communicate(timeout=240) for writer in writers]
    followed = [follower.communicate("finish\n", timeout=150) for follower in followers]
    for process, (_, err) in zip(writers + followers, written + followed, strict=True):
        assert LOCKED not in err
        assert process.returncode == 0, err[-3000:]
    return [json.loads(out) for out, _ in written], [json.loads(out) for out, _ in followed]


def all_notifications(engine: Engine) -> list[Any]:
    """Every stored event in notification (global) order."""
    recorder = engine.store.recorder
    found: list[Any] = []
    while True:
        start = found[-1].id if found else 0
        page = recorder.select_notifications(start=start, limit=5000, inclusive_of_start=False)
        found.extend(page)
        if len(page) < 5000:
            return found


def engine_runs(url: str) -> list[RunSummary]:
    """Every run of the store, from its index."""
    with Engine(url, create=False) as engine:
        return engine.runs(limit=10_000)


@pytest.mark.slow
class TestManyWriters:
    @pytest.mark.parametrize("backend", list(FLEETS))
    def test_every_event_exactly_once_and_projections_equal_a_rebuild(
        self, backend: str, request: pytest.FixtureRequest
    ) -> None:
        """Workers supervise runs while two followers fold them: nothing lost, doubled, skipped."""
        workers, runs = FLEETS[backend]
        url = request.getfixturevalue(backend)
        reports, follows = run_fleet(url, workers, runs)
        recorded = {UUID(run): tuple(end) for r in reports for run, end in r["runs"].items()}
        events = sum(report["events"] for report in reports)
        seconds = max(r["ended"] for r in reports) - min(r["began"] for r in reports)
        lags = [follow["max_lag"] for follow in follows]
        print(f"{backend}: {len(recorded)} runs, {events} events in {seconds:.1f} s, lag {lags}")
        assert len(recorded) == workers * runs
        for follow in follows:
            assert [(name, lag, error) for name, _, _, lag, error in follow["status"]] == [
                ("failure_patterns", 0, None),
                ("run_index", 0, None),
            ]
        with Engine(url, create=False) as engine:
            self._check_global_order(engine, recorded)
            self._check_each_run(engine, recorded)
            self._check_projections(engine, recorded)

    def _check_global_order(self, engine: Engine, recorded: dict[UUID, tuple[int, str]]) -> None:
        """One notification per (run, version), ids increasing, each run's versions in order."""
        notifications = all_notifications(engine)
        ids = [n.id for n in notifications]
        assert ids == sorted(set(ids))
        keys = [(UUID(str(n.originator_id)), n.originator_version) for n in notifications]
        assert len(keys) == len(set(keys)) == sum(version for version, _ in recorded.values())
        versions: dict[UUID, list[int]] = {}
        for run_id, version in keys:
            versions.setdefault(run_id, []).append(version)
        assert versions.keys() == recorded.keys()
        for run_id, seen in versions.items():
            assert seen == list(range(1, recorded[run_id][0] + 1))

    def _check_each_run(self, engine: Engine, recorded: dict[UUID, tuple[int, str]]) -> None:
        """Each run starts once, ends finished with the status its worker saw, and verifies."""
        for run_id, (version, status) in recorded.items():
            events = engine.events(run_id)
            kinds = Counter(type(event) for event in events)
            assert (kinds[RunStarted], kinds[RunFinished]) == (1, 1)
            assert isinstance(events[-1], RunFinished)
            assert (events[-1].version, events[-1].status) == (version, status)
            assert engine.verify(run_id).ok

    def _check_projections(self, engine: Engine, recorded: dict[UUID, tuple[int, str]]) -> None:
        """The followed states have no lag and equal a rebuild from zero."""
        projections = engine.projections
        assert {status.name: status.lag for status in projections.status()} == {
            FailurePatterns.name: 0,
            RunIndex.name: 0,
        }
        names = (RunIndex.name, FailurePatterns.name)
        followed = {name: projections.states(name, catch_up=False) for name in names}
        for name in names:
            projections.rebuild(name)
        rebuilt = {name: projections.states(name, catch_up=False) for name in names}
        assert followed == rebuilt
        index = followed[RunIndex.name]
        assert {UUID(key): summary.status for key, summary in index.items()} == {
            run_id: status for run_id, (_, status) in recorded.items()
        }
        patterns = followed[FailurePatterns.name]["code-review"]
        failures = sum(summary.failures for summary in index.values())
        assert patterns.total == failures > 0


class TestWorker:
    def test_the_report_matches_the_store(self, sqlite_url: str) -> None:
        """A worker's report (runs, versions, statuses, events) is what the store holds."""
        worker = start("worker", sqlite_url, "--index", "3", "--runs", "7")
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        report = json.loads(out)
        with Engine(sqlite_url, create=False) as engine:
            stored = {str(run.run_id): [run.version, run.status] for run in engine.runs()}
        assert stored == report["runs"]
        assert report["events"] == sum(run.version for run in engine_runs(sqlite_url))
        assert {status for _, status in report["runs"].values()} <= {"succeeded", "failed"}
