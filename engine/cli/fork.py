"""`stagetrail fork`: a new run that starts with a copy of another run's first events."""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from engine.cli.common import Output, print_json, short

if TYPE_CHECKING:
    from engine.engine import Engine


def fork_run(engine: Engine, run_id: UUID, at: int, *, as_json: bool) -> None:
    """Fork the run at `at` and say where the new run is."""
    run = engine.fork(run_id, at=at)
    if as_json:
        print_json(
            {
                "run_id": str(run.id),
                "forked_from": [str(run_id), at],
                "state": run.state,
                "version": run.version,
            }
        )
        return
    out = Output()
    out.line(f"forked run {short(run_id)} at event {at} into run {run.id}")
    out.line(f"the new run is in state {run.state} with {run.version} events; continue it with")
    out.line(f"  engine.load({str(run.id)!r})")
