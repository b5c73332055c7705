"""Random legal histories: every way of computing a projection gives the same state."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, Run, StagetrailError
from engine.readside import TimeTravel
from events import Event
from projections import BUILT_INS, Projection
from tests._helpers import POSTGRES_URL, REVIEW, require_postgres
from tests.projections._own_way import prefixes

ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["parent", "child"]),
        st.sampled_from(
            [
                "completed",
                "failed",
                "aborted",
                "start",
                "rollback",
                "add_task",
                "task_started",
                "task_completed",
                "task_failed",
                "spend",
                "progress",
                "note",
                "finish",
            ]
        ),
        st.integers(min_value=1, max_value=3),
    ),
    max_size=40,
)


def act(run: Run, action: str, number: int) -> Event:
    """Record one action on `run`; the engine refuses the illegal ones."""
    state, task = run.state, f"task-{number}"
    recorders: dict[str, Any] = {
        "completed": lambda: run.stage_completed(state, result={"n": number}),
        "failed": lambda: run.stage_failed(state, error=f"e{number}", error_type=f"T{number}"),
        "aborted": lambda: run.stage_completed(state, outcome="aborted"),
        "start": lambda: run.stage_started(state),
        "rollback": lambda: run.rollback(number),
        "add_task": lambda: run.add_task(task, parent="task-1" if number > 1 else None),
        "task_started": lambda: run.task_started(task),
        "task_completed": lambda: run.task_completed(task, result=number),
        "task_failed": lambda: run.task_failed(task, error="no"),
        "spend": lambda: run.spend(0.25 * number, "usd"),
        "progress": lambda: run.observe_progress(
            changed_files=number - 1, test_signature=f"s{number % 2}", functional_ok=number == 3
        ),
        "note": lambda: run.note("n", number),
        "finish": lambda: run.finish("failed"),
    }
    return recorders[action]()  # type: ignore[no-any-return]


@contextmanager
def fresh_engine(backend: str, tmp_path: Path) -> Iterator[Engine]:
    """A new, empty store of `backend` for one Hypothesis example."""
    if backend == "sqlite":
        with Engine(f"sqlite:///{tmp_path / uuid.uuid4().hex}.db") as engine:
            yield engine
        return
    import psycopg

    schema = f"p_{uuid.uuid4().hex[:16]}"
    try:
        with Engine(f"{POSTGRES_URL}?schema={schema}") as engine:
            yield engine
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def record(engine: Engine, steps: list[tuple[str, str, int]]) -> tuple[dict[str, Run], list[Event]]:
    """Record the legal steps on a parent run and a child run; return them and every event."""
    parent = engine.start_run(REVIEW)
    child = engine.start_run(REVIEW, parent=parent)
    runs = {"parent": parent, "child": child}
    recorded = [*engine.events(parent.id), *engine.events(child.id)]
    for which, action, number in steps:
        # A refused step writes nothing: that is the engine's job, tested elsewhere.
        with contextlib.suppress(StagetrailError):
            recorded.append(act(runs[which], action, number))
    return runs, recorded


def persistent(engine: Engine, projection: Projection[Any], run: Run) -> Any:
    """The materialized state that holds `run` for the projection's scope."""
    key = {"run": str(run.id), "pipeline": REVIEW.name, "all": ""}[projection.scope]
    return engine.projections.get(projection.name, key)


@pytest.mark.slow
class TestEveryWayAgrees:
    @pytest.mark.parametrize("backend", ["sqlite", "postgres"])
    @settings(
        max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(steps=ACTIONS)
    def test_incremental_store_persistent_and_time_travel_agree(
        self, backend: str, tmp_path: Path, steps: list[tuple[str, str, int]]
    ) -> None:
        """For every built-in: incremental fold == fold from the store == catch-up == at=N."""
        if backend == "postgres":
            require_postgres()
        with fresh_engine(backend, tmp_path) as engine:
            for projection_class in BUILT_INS:
                if projection_class.name not in engine.projections.names:
                    engine.projections.register(projection_class)
            runs, recorded = record(engine, steps)
            # Snapshots every 3 events, so short histories exercise the snapshot paths too.
            warm = TimeTravel(engine.store, engine.store.views, interval=3)
            for projection_class in BUILT_INS:
                projection = projection_class()
                for run in runs.values():
                    own = [e for e in recorded if e.run_id == run.id]
                    states = prefixes(projection, own)
                    assert projection.fold(engine.events(run.id)) == states[-1]
                    for version, expected in enumerate(states):
                        assert engine.project(run.id, projection, at=version) == expected
                        assert warm.project(run.id, projection, version) == expected
                    cold = TimeTravel(engine.store, engine.store.views, interval=3)
                    assert cold.project(run.id, projection, len(own)) == states[-1]
                    if projection.scope == "run":
                        assert persistent(engine, projection, run) == states[-1]
                if projection.scope != "run":
                    whole = projection.fold(recorded)
                    assert persistent(engine, projection, runs["parent"]) == whole
