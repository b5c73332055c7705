"""`stagetrail state`: a run's projection (the state stack by default) at any point."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any
from uuid import UUID

from engine.arguments import version_at
from engine.cli.common import (
    Output,
    compact,
    parse_at,
    print_json,
    seconds,
    short,
)
from engine.cli.projections import find_projection
from engine.errors import RunNotFound
from projections import Stack

if TYPE_CHECKING:
    from engine.engine import Engine


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
