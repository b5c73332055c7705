"""`stagetrail demo`: record the bundled examples and print what was recorded."""

from __future__ import annotations

from collections import Counter
from uuid import UUID

from engine.cli.common import STATUS_STYLES, Output
from engine.cli.suggestions import next_commands
from engine.engine import Engine
from engine.run import Run
from events import StageCompleted, StageFailed


def _summary_row(engine: Engine, run: Run) -> list[str]:
    kinds = Counter(type(event) for event in engine.events(run.id))
    attempts = kinds[StageCompleted] + kinds[StageFailed]
    return [
        str(run.id)[:8],
        run.pipeline.name,
        run.status,
        run.state,
        str(run.version),
        str(attempts),
        str(kinds[StageFailed]),
    ]


def _title(engine: Engine, runs: list[Run]) -> str:
    children = sum(len(engine.tree(run.id)) - 1 for run in runs)
    extra = f" and {children} child runs" if children else ""
    return f"Recorded {len(runs)} runs{extra} into {engine.url}"


def _events(engine: Engine, run_id: UUID) -> int:
    last = engine.store.last(run_id)
    return 0 if last is None else last.version


def run_demo(store: str | None) -> None:
    """Record the examples into `store` (default store if None) and print a summary."""
    from engine.cli.demo.record import record_all
    from engine.store.urls import default_url

    out = Output()
    with Engine(store) as engine:
        runs = record_all(engine, store or default_url())  # the URL, for a child process
        out.table(
            ("run", "pipeline", "status", "state", "events", "attempts", "failures"),
            [_summary_row(engine, run) for run in runs],
            title=_title(engine, runs),
            styles=[STATUS_STYLES.get(run.status) for run in runs],
            right=(4, 5, 6),
            wrap=(1, 3),
        )
        total = sum(_events(engine, run_id) for run in runs for run_id in engine.tree(run.id))
        out.line(f"{total} events recorded. Reload any run with Engine().load(run_id).")
        out.line()
        out.line("Three commands worth trying next:", "bold")
        for command in next_commands(engine, runs, store):
            out.line(f"  {command}")
