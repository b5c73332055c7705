"""`stagetrail projections list|status|rebuild`, and finding a projection by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.cli.common import BadOption, Output, ProgressBar, import_object, print_json
from projections import BUILT_INS, Projection, UnknownProjection, as_projection

if TYPE_CHECKING:
    from engine.engine import Engine


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
    engine.projections.settle()  # those registered lazily: recorded as a writer's open does
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


def find_projection(engine: Engine, name: str) -> Projection[Any]:
    """A projection by its `name` (built-in or registered in the store), or ``module:attr``.

    Raises:
        UnknownProjection: no projection of that name.
        BadOption: ``module:attr`` does not name a projection.
    """
    if ":" in name:
        found = import_object("--projection", name)
        if not (isinstance(found, Projection) or _is_projection_class(found)):
            raise BadOption("--projection", name, "is not a Projection (class or instance)")
        return as_projection(found)
    for cls in BUILT_INS:
        if cls.name == name:
            return cls()
    if name in engine.projections.names:
        return engine.projections.projection(name)
    known = sorted({cls.name for cls in BUILT_INS} | set(engine.projections.names))
    raise UnknownProjection(name, known)


def _is_projection_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, Projection)
