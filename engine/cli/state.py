"""`stagetrail state`, `fork` and `verify`: a run at a point, a copy of it, a check of it."""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any
from uuid import UUID

from engine.arguments import version_at
from engine.cli.common import (
    BadOption,
    Output,
    compact,
    parse_at,
    print_json,
    seconds,
    short,
)
from engine.errors import RunNotFound
from projections import BUILT_INS, Projection, Stack, UnknownProjection, as_projection

if TYPE_CHECKING:
    from engine.engine import Engine


def import_object(option: str, spec: str) -> Any:
    """The object ``module:attr`` names (the current directory is importable, as with -m).

    Raises:
        BadOption: the module or the attribute cannot be found.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadOption(option, spec, "expected module:attr")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # an ImportError, or whatever the module raised on import
        problem = f"cannot import {module_name}: {type(error).__name__}: {error}"
        raise BadOption(option, spec, problem) from None
    value = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise BadOption(option, spec, f"{module_name} has no attribute {attr!r}")
        value = getattr(value, part)
    return value


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


def show_state(
    engine: Engine, run_id: UUID, at_text: str | None, name: str, *, as_json: bool
) -> None:
    """Print `name`'s state of the run after event `--at` (default: now)."""
    projection = find_projection(engine, name)
    last = engine.store.last(run_id)
    if last is None:
        raise RunNotFound(run_id, engine.url)
    at = last.version if at_text is None else parse_at(at_text)
    version = version_at(engine.store, run_id, at, last.version, "at")
    state = engine.project(run_id, projection, at=version)
    if as_json:
        print_json(
            {
                "run_id": str(run_id),
                "projection": projection.name,
                "version": version,
                "last_version": last.version,
                "state": projection.encode(state),
            }
        )
        return
    out = Output()
    out.line(
        f"{projection.name} of run {short(run_id)} after event {version} of {last.version}", "bold"
    )
    if isinstance(state, Stack):
        _stack_table(out, state)
    else:
        _json_block(out, projection.encode(state))


def _stack_table(out: Output, stack: Stack) -> None:
    out.line(f"current state: {stack.current}, depth {stack.depth}")
    if not stack.depth:
        return
    rows = [
        [
            str(depth),
            str(frame.version),
            frame.state,
            frame.stage,
            frame.outcome,
            str(frame.attempt),
            seconds(frame.duration),
            _frame_detail(frame.result, frame.error, frame.error_type),
        ]
        for depth, frame in enumerate(stack.frames, start=1)
    ]
    out.table(
        ["#", "v", "state", "stage", "outcome", "try", "took", "result or error"],
        rows,
        styles=["red" if frame.failed else None for frame in stack.frames],
        right=(0, 1, 5, 6),
    )


def _frame_detail(result: Any, error: str | None, error_type: str | None) -> str:
    if error_type is not None:
        return compact(f"{error_type}: {error}", 60)
    return "" if result is None else compact(result, 60)


def _json_block(out: Output, value: Any) -> None:
    if out.terminal:
        out.console.print_json(json.dumps(value, ensure_ascii=False))
    else:
        sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


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


def verify_run(engine: Engine, run_id: UUID, *, as_json: bool) -> bool:
    """Verify the run; print the report; return whether it is sound."""
    report = engine.verify(run_id)
    if as_json:
        print_json(
            {
                "run_id": str(run_id),
                "ok": report.ok,
                "events": report.events,
                "problems": [
                    {"version": p.version, "check": p.check, "message": p.message}
                    for p in report.problems
                ],
            }
        )
        return report.ok
    out = Output()
    if report.ok:
        out.line(f"run {short(run_id)}: {report.events} events, no problems", "green")
        return True
    out.line(
        f"run {short(run_id)}: {report.events} events, {len(report.problems)} problem(s)", "red"
    )
    rows = [[str(p.version), p.check, p.message] for p in report.problems]
    out.table(["v", "check", "problem"], rows, right=(0,))
    return False
