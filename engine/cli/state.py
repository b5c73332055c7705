"""`stagetrail state`: a run's projection (the state stack by default) at any point.

With ``--tree``, of the run and its child runs folded together.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from engine.arguments import version_at
from engine.cli.common import (
    BadOption,
    Output,
    compact,
    json_text,
    parse_at,
    print_json,
    seconds,
    short,
    when,
)
from engine.cli.projections import find_projection
from engine.errors import RunNotFound
from engine.payloads import readable_result
from projections import Projection, Stack

if TYPE_CHECKING:
    from engine.engine import Engine


def show_state(
    engine: Engine,
    run_id: UUID,
    at_text: str | None,
    name: str,
    *,
    tree: bool = False,
    as_json: bool,
) -> None:
    """Print `name`'s state of the run after event `--at` (default: now).

    With `tree`, of the run and all its child runs folded together in time order;
    `--at` may then only be a time, since versions are per run.

    Raises:
        BadOption: a bad `--at`, or a version `--at N` with `tree`.
    """
    projection = find_projection(engine, name)
    last = engine.store.last(run_id)
    if last is None:
        raise RunNotFound(run_id, engine.url)
    if tree:
        _show_tree_state(engine, run_id, at_text, projection, as_json=as_json)
        return
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
    point = f"after event {version} of {last.version}"
    if version == 0:
        point = f"at version 0 of {last.version}: before its first event"
    out.line(f"{projection.name} of run {short(run_id)} {point}", "bold")
    _show(out, projection, state)


def _show_tree_state(
    engine: Engine,
    run_id: UUID,
    at_text: str | None,
    projection: Projection[Any],
    *,
    as_json: bool,
) -> None:
    at = None if at_text is None else parse_at(at_text)
    if at is not None and not isinstance(at, datetime):
        raise BadOption(
            "--at",
            at_text,
            "with --tree, give a time (2026-11-20T09:00:00Z, 90m): versions are per run",
        )
    state = engine.project(run_id, projection, at=at, tree=True)
    runs = [_tree_member(engine, member, at) for member in engine.tree(run_id)]
    if as_json:
        print_json(
            {
                "run_id": str(run_id),
                "projection": projection.name,
                "tree": True,
                "at": None if at is None else at.astimezone(UTC).isoformat(),
                "runs": [
                    {"run_id": str(member), "version": version, "last_version": last}
                    for member, version, last in runs
                ],
                "state": projection.encode(state),
            }
        )
        return
    folded = sum(version for _, version, _ in runs)
    total = sum(last for _, _, last in runs)
    moment = "" if at is None else f" at {when(at)}"
    count = f"{len(runs)} run" + ("" if len(runs) == 1 else "s")
    out = Output()
    out.line(
        f"{projection.name} of the tree of run {short(run_id)} ({count}){moment},"
        f" after {folded} of {total} events",
        "bold",
    )
    _show(out, projection, state)


def _tree_member(engine: Engine, run_id: UUID, at: datetime | None) -> tuple[UUID, int, int]:
    """A run of the tree, the last of its events folded (by `at`) and its last event."""
    last = engine.store.last(run_id)
    last_version = 0 if last is None else last.version
    if at is None:
        return run_id, last_version, last_version
    return run_id, version_at(engine.store, run_id, at, last_version, "at"), last_version


def _show(out: Output, projection: Projection[Any], state: Any) -> None:
    if isinstance(state, Stack):
        _stack_table(out, state)
    else:
        _json_block(out, projection.encode(state))


def _stack_table(out: Output, stack: Stack) -> None:
    if stack.current is None:  # only before RunStarted: version 0, or a tree before its start
        out.line("no state yet: the run had not started (its first event, RunStarted, starts it)")
        return
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
    return "" if result is None else compact(readable_result(result), 60)


def _json_block(out: Output, value: Any) -> None:
    if out.terminal:
        out.console.print_json(json_text(value, indent=None))
    else:
        sys.stdout.write(json_text(value) + "\n")
