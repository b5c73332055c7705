"""`stagetrail diagram`: a pipeline's table as Mermaid or DOT, from code or from a run."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from engine.cli.common import BadOption, clean, import_object, open_engine, resolve_run
from engine.diagram import drawn_table
from engine.errors import StoreError
from engine.payloads import observed_graph
from engine.pipeline import Pipeline
from events import RunStarted
from projections import RunIndex

if TYPE_CHECKING:
    from uuid import UUID

    from engine.engine import Engine


def draw(target: str, kind: str, store: str | None) -> None:
    """Print the Mermaid or DOT source of a pipeline (``module:attr``) or of a run's table."""
    if ":" in target:
        pipeline = import_object("PIPELINE_OR_RUN", target)
        if not isinstance(pipeline, Pipeline):
            raise BadOption("PIPELINE_OR_RUN", target, "is not a Pipeline")
        current = None
    else:
        with open_engine(store, read_only=True) as engine:
            pipeline, current = _recorded(engine, resolve_run(engine, target))
    source = pipeline.to_mermaid(current) if kind == "mermaid" else pipeline.to_dot(current)
    sys.stdout.write(clean(source.rstrip("\n")) + "\n")


def _recorded(engine: Engine, run_id: UUID) -> tuple[Pipeline, str | None]:
    """The table stored in the run's `RunStarted`, and the run's current state."""
    first = engine.store.read(run_id, lte=1)
    if not first or not isinstance(first[0], RunStarted):
        raise StoreError(engine.url, f"run {run_id} does not begin with RunStarted")
    observed = observed_graph(engine.store.stream(run_id))  # the first events, at most
    pipeline = Pipeline.from_dict(drawn_table(first[0].table, first[0].params, observed))
    summary = engine.project(run_id, RunIndex)
    current = None if summary is None else summary.state
    return pipeline, current if current in pipeline.states else None
