"""A store read's lean path (a UUID, a backend of rows): every bound and check of the full one."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from engine import Engine
from engine.errors import RunBeingErased
from events import Event, NoteAdded, StageCompleted, StageFailed
from projections import StageResults, StateStack
from tests._helpers import REVIEW
from tests.test_compact import FIRST_ERASE, HALF, half_erased

BIG = [2**64, -(2**64) - 1, 10**19, 10**40, -(10**25)]
"""Ints beyond 64 bits (and nineteen digits) that orjson would read as floats."""


@pytest.fixture(params=["memory", "sqlite-compact", "sqlite-text", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend and SQLite layout."""
    if request.param == "memory":
        return "memory://"
    if request.param.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'runs.db'}?layout={request.param.split('-')[1]}"
    return str(request.getfixturevalue("postgres_url"))


def big_run(engine: Engine) -> UUID:
    """A run whose results and notes hold long ints at shifting byte offsets."""
    run = engine.start_run(REVIEW, params={"n": 2**70})
    run.stage_completed("project_analysis", {"big": BIG[0], "pad": "x"})
    run.stage_completed("code_review", {})
    run.stage_failed("developer", error="no", error_type="X")
    for shift, value in enumerate(BIG):
        run.note("k" + "x" * shift, {"v": [value, 1.5e-9, "2026-11-28T04:24:19.180479+00:00"]})
    run.stage_completed("developer", {"v": BIG, str(BIG[3]): BIG[3]})
    return run.id


def exact(value: Any) -> str:
    """`repr`: an int and a float equal to it differ."""
    return repr(value)


class TestLeanRead:
    def test_every_bound_reads_as_the_full_read(self, url: str) -> None:
        """`read` of a UUID (the lean path) gives what a read of the id as text (`_get`)
        gives and what slicing the history gives, for every bound, limit and topic set."""
        with Engine(url) as engine:
            run_id = big_run(engine)
            history = engine.store.read(str(run_id))  # type: ignore[arg-type]
            count = len(history)
            topics_sets: list[Any] = [None, {StageFailed.topic}, {NoteAdded.topic}, set()]
            bounds = [None, 0, 1, 3, count - 1, count, count + 2]
            for gt, lte, limit, topics in itertools.product(
                bounds, bounds, [None, 1, 3, count], topics_sets
            ):
                expected = [
                    e
                    for e in history
                    if (gt is None or e.version > gt) and (lte is None or e.version <= lte)
                ][:limit]
                if topics is not None:
                    expected = [e for e in expected if e.topic in topics]
                lean = engine.store.read(run_id, gt=gt, lte=lte, limit=limit, topics=topics)
                text: Any = str(run_id)  # read by `_get`, the full read
                full = engine.store.read(text, gt=gt, lte=lte, limit=limit, topics=topics)
                assert exact(lean) == exact(full) == exact(expected), (gt, lte, limit, topics)

    def test_long_ints_read_back_exactly_by_every_path(self, url: str) -> None:
        """Ints beyond 64 bits come back exact from read, stream, events, point-in-time
        projections and a page the database joins."""
        with Engine(url) as engine:
            run_id = big_run(engine)
            count = len(engine.store.read(run_id))
            paths: list[list[Event]] = [
                engine.store.read(run_id),
                engine.store.read(run_id, gt=1, lte=count),
                list(engine.store.stream(run_id)),
                engine.events(run_id),
            ]
            for events in paths:
                assert exact([e for e in events if isinstance(e, NoteAdded)][-1].value) == exact(
                    {"v": [BIG[-1], 1.5e-9, "2026-11-28T04:24:19.180479+00:00"]}
                )
                last = events[-1]
                assert isinstance(last, StageCompleted)
                assert exact(last.result) == exact({"v": BIG, str(BIG[3]): BIG[3]})
            at_two = engine.project(run_id, StateStack, at=2)
            assert exact(at_two.latest_result("project_analysis")) == exact(
                {"big": BIG[0], "pad": "x"}
            )
            newest = engine.project(run_id, StageResults, at=count)
            assert exact(newest.latest("developer")) == exact({"v": BIG, str(BIG[3]): BIG[3]})


@pytest.fixture(params=["sqlite", "postgres"])
def erased_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A SQLite file or a PostgreSQL schema, for a run whose erase has begun."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        yield str(request.getfixturevalue("postgres_url"))


class TestLeanReadOfARunBeingErased:
    def test_every_bound_reaching_the_hole_is_refused(
        self, erased_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A lean read whose versions reach the erased ones is refused as the full read is;
        one wholly below them reads."""
        _, doomed = half_erased(erased_url, monkeypatch)
        hole = HALF - FIRST_ERASE  # the first version gone
        with Engine(erased_url) as engine:
            for gt, lte, limit in [
                (None, None, None), (None, HALF - 1, None), (hole - 3, hole + 1, None),
                (hole - 1, None, 5), (None, hole, None), (hole - 2, HALF, 10),
            ]:  # fmt: skip
                for given in (doomed, str(doomed)):
                    with pytest.raises(RunBeingErased):
                        engine.store.read(given, gt=gt, lte=lte, limit=limit)  # type: ignore[arg-type]
            below = engine.store.read(doomed, gt=2, lte=hole - 1)
            assert [e.version for e in below] == list(range(3, hole))
            assert engine.project(doomed, StateStack, at=hole - 1).depth == 0
