"""`stagetrail demo`: record the bundled examples and print what was recorded."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from engine.engine import Engine
from engine.run import Run
from events import StageCompleted, StageFailed


def _summary_row(engine: Engine, run: Run) -> list[str]:
    kinds = Counter(type(event) for event in engine.events(run.id))
    attempts = kinds[StageCompleted] + kinds[StageFailed]
    return [
        str(run.id)[:8],
        run.pipeline.name,
        run.status or "running",
        run.state,
        str(run.version),
        str(attempts),
        str(kinds[StageFailed]),
    ]


def run_demo(store: str | None) -> None:
    """Record the examples into `store` (default store if None) and print a summary."""
    from examples.code_review import record_all

    console = Console()
    with Engine(store) as engine:
        runs = record_all(engine)
        table = Table(title=f"Recorded {len(runs)} runs into {engine.url}")
        for column in ("run", "pipeline", "status", "state", "events", "attempts", "failures"):
            table.add_column(column)
        for run in runs:
            table.add_row(*_summary_row(engine, run))
        console.print(table)
        total = sum(run.version for run in runs)
        console.print(f"{total} events recorded. Reload any run with Engine().load(run_id).")
