"""`stagetrail diagram` and `stagetrail projections list|status|rebuild`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from engine.cli.common import BadOption, Output, ProgressBar, open_engine, print_json, resolve_run
from engine.cli.state import find_projection, import_object
from engine.errors import StoreError
from engine.pipeline import Pipeline
from events import RunStarted
from projections import BUILT_INS, Projection, RunIndex

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
        with open_engine(store) as engine:
            pipeline, current = _recorded(engine, resolve_run(engine, target))
    source = pipeline.to_mermaid(current) if kind == "mermaid" else pipeline.to_dot(current)
    sys.stdout.write(source.rstrip("\n") + "\n")


def _recorded(engine: Engine, run_id: UUID) -> tuple[Pipeline, str | None]:
    """The table stored in the run's `RunStarted`, and the run's current state."""
    first = engine.store.read(run_id, lte=1)
    if not first or not isinstance(first[0], RunStarted):
        raise StoreError(engine.url, f"run {run_id} does not begin with RunStarted")
    pipeline = Pipeline.from_dict(first[0].table)
    summary = engine.project(run_id, RunIndex)
    return pipeline, None if summary is None else summary.state


def _known(engine: Engine) -> dict[str, Projection[Any]]:
    found: dict[str, Projection[Any]] = {cls.name: cls() for cls in BUILT_INS}
    for name in engine.projections.names:
        found[name] = engine.projections.projection(name)
    return dict(sorted(found.items()))


def list_projections(engine: Engine, *, as_json: bool) -> None:
    """Print the projections known by name, and which this store keeps."""
    kept = set(_stored_names(engine))
    rows: list[dict[str, Any]] = [
        {
            "name": name,
            "class": f"{type(p).__module__}.{type(p).__qualname__}",
            "scope": p.scope,
            "persistent": name in kept,
        }
        for name, p in _known(engine).items()
    ]
    if as_json:
        print_json(rows)
        return
    Output().table(
        ["name", "class", "scope", "persistent"],
        [[r["name"], r["class"], r["scope"], "yes" if r["persistent"] else "no"] for r in rows],
    )


def _stored_names(engine: Engine) -> list[str]:
    """The projections this store keeps a state of (registered by any process)."""
    return sorted(engine.projections.views.errors())


def projection_status(engine: Engine, *, as_json: bool) -> None:
    """Print position, head, lag and last error of every projection the store keeps."""
    statuses = _statuses(engine)
    if as_json:
        print_json(statuses)
        return
    Output().table(
        ["name", "position", "head", "lag", "last error"],
        [
            [s["name"], str(s["position"]), str(s["head"]), str(s["lag"]), s["last_error"] or ""]
            for s in statuses
        ],
        styles=["red" if s["last_error"] else None for s in statuses],
        right=(1, 2, 3),
    )


def _statuses(engine: Engine) -> list[dict[str, Any]]:
    registered = {s.name: s for s in engine.projections.status()}
    names = _stored_names(engine)
    positions = engine.projections.views.positions(names)
    errors = engine.projections.views.errors()
    head = engine.projections.head()
    rows = []
    for name in names:
        known = registered.get(name)
        position = known.position if known else positions[name]
        rows.append(
            {
                "name": name,
                "position": position,
                "head": head,
                "lag": max(head - position, 0),
                "last_error": known.last_error if known else errors.get(name),
            }
        )
    return rows


def rebuild_projection(engine: Engine, name: str, *, as_json: bool) -> None:
    """Fold projection `name` again from the first event, with a progress bar on stderr."""
    projection = find_projection(engine, name)
    engine.projections.register(projection)
    head = engine.projections.head()
    progress = ProgressBar(f"rebuild {projection.name}", head)
    done = [0]

    def moved(moving: str, end: int, _head: int) -> None:
        if moving == projection.name:
            progress.advance(end - done[0])
            done[0] = end

    try:
        folded = engine.projections.rebuild(projection.name, on_progress=moved)
    finally:
        progress.close()
    if as_json:
        print_json({"name": projection.name, "events": folded, "position": head})
        return
    Output().line(f"rebuilt {projection.name}: {folded} events folded, position {head}")
