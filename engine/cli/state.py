"""`stagetrail state`: a run's projection (the state stack by default) at any point.

With ``--tree``, of the run and its child runs folded together. A state stack is
shown by its newest frames (``--frames``, 20 by default), so the answer stays
the same size however deep the stack of a long run grows.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from itertools import islice
from typing import TYPE_CHECKING, Any
from uuid import UUID

import attrs

from engine.arguments import version_at
from engine.cli.common import (
    BadOption,
    Output,
    compact,
    count_or_all,
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
from projections.immutable import PList

if TYPE_CHECKING:
    from engine.engine import Engine

FRAMES = 20
"""Frames of a state stack shown unless --frames says otherwise."""
TREE_RUNS = 100
"""Runs of a tree that --tree --json lists, parents first (the rest are counted)."""
ITEMS = 100
"""Entries of each list or mapping of another projection's state shown unless --items says."""


def frame_limit(text: str) -> int | None:
    """How many of a stack's newest frames ``--frames`` asks for (None: all of them).

    Raises:
        BadOption: neither a whole number >= 1 nor ``all``.
    """
    return count_or_all("--frames", text)


def item_limit(text: str) -> int | None:
    """How many entries of each list or mapping ``--items`` asks for (None: all of them).

    Raises:
        BadOption: neither a whole number >= 1 nor ``all``.
    """
    return count_or_all("--items", text)


def cut_json(value: Any, limit: int | None) -> tuple[Any, int]:
    """`value` with every list and mapping cut to its first `limit` entries, and how many
    entries were left out in all (a task table or a results table grows with the run)."""
    if limit is None:
        return value, 0
    if isinstance(value, dict):
        kept = list(islice(value.items(), limit))
        left = len(value) - len(kept)
        pairs = [(key, *cut_json(item, limit)) for key, item in kept]
        return {key: item for key, item, _ in pairs}, left + sum(n for _, _, n in pairs)
    if isinstance(value, list):
        cuts = [cut_json(item, limit) for item in value[:limit]]
        left = max(len(value) - limit, 0)
        return [item for item, _ in cuts], left + sum(n for _, n in cuts)
    return value, 0


def check_applies(projection: Projection[Any], given: Mapping[str, str] | None) -> None:
    """Refuse ``--frames`` for a projection whose state is no stack, ``--items`` for a stack.

    Raises:
        BadOption: naming the option and ``--projection``.
    """
    stacked = isinstance(projection.initial(), Stack)
    wrong, right = ("--items", "--frames") if stacked else ("--frames", "--items")
    if given and wrong in given:
        kind = "is a state stack" if stacked else "is not a state stack"
        raise BadOption(
            wrong,
            given[wrong],
            f"does not apply to --projection {projection.name}, which {kind}: use {right}",
        )


@attrs.frozen
class Shown:
    """A state as shown: a stack cut to its newest frames, and how many were left out."""

    state: Any
    left_out: int = 0
    items: int | None = ITEMS

    @classmethod
    def of(cls, state: Any, limit: int | None, items: int | None = ITEMS) -> Shown:
        """`state`, a `Stack` cut to its newest `limit` frames (None: all of them); any
        other state is cut when encoded, to `items` entries per list or mapping."""
        if not isinstance(state, Stack):
            return cls(state, items=items)
        if limit is None or state.depth <= limit:
            return cls(state)
        newest = list(islice(state.frame_list.newest_first(), limit))
        newest.reverse()
        cut = Stack(initial=state.initial, table=state.table, frame_list=PList.of(newest))
        return cls(cut, state.depth - limit)

    def fields(self, projection: Projection[Any]) -> dict[str, Any]:
        """The JSON fields: the encoded state, and for a stack its depth and frames left out."""
        if isinstance(self.state, Stack):
            return {
                "state": projection.encode(self.state),
                "depth": self.state.depth + self.left_out,
                "frames_left_out": self.left_out,
            }
        encoded, left_out = self.encoded(projection)
        return {"state": encoded, "items_left_out": left_out}

    def encoded(self, projection: Projection[Any]) -> tuple[Any, int]:
        """The state as JSON, cut to `items` entries per list or mapping, and the entries left
        out."""
        return cut_json(projection.encode(self.state), self.items)


def show_state(
    engine: Engine,
    run_id: UUID,
    at_text: str | None,
    name: str,
    *,
    tree: bool = False,
    frames: int | None = FRAMES,
    items: int | None = ITEMS,
    given: Mapping[str, str] | None = None,
    as_json: bool,
) -> None:
    """Print `name`'s state of the run after event `--at` (default: now).

    With `tree`, of the run and all its child runs folded together in time order;
    `--at` may then only be a time, since versions are per run. A stack shows its
    newest `frames` frames (None: all) and says how many older ones it left out; any
    other state its first `items` entries of each list or mapping (None: all).

    `given` maps the options given on the command line (``--frames``, ``--items``) to
    their values: each must apply to the projection's state.

    Raises:
        BadOption: a bad `--at`, a version `--at N` with `tree`, or ``--frames`` of a
            projection that is not a stack (``--items`` of one that is).
    """
    projection = find_projection(engine, name)
    check_applies(projection, given)
    last = engine.store.last(run_id)
    if last is None:
        raise RunNotFound(run_id, engine.url)
    if tree:
        _show_tree_state(engine, run_id, at_text, projection, frames, items, as_json=as_json)
        return
    at = last.version if at_text is None else parse_at(at_text)
    version = version_at(engine.store, run_id, at, last.version, "at")
    shown = Shown.of(engine.project(run_id, projection, at=version), frames, items)
    if as_json:
        print_json(
            {
                "run_id": str(run_id),
                "projection": projection.name,
                "version": version,
                "last_version": last.version,
                **shown.fields(projection),
            }
        )
        return
    out = Output()
    point = f"after event {version} of {last.version}"
    if version == 0:
        point = f"at version 0 of {last.version}: before its first event"
    out.line(f"{projection.name} of run {short(run_id)} {point}", "bold")
    _show(out, projection, shown)


def _show_tree_state(
    engine: Engine,
    run_id: UUID,
    at_text: str | None,
    projection: Projection[Any],
    frames: int | None,
    items: int | None,
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
    shown = Shown.of(engine.project(run_id, projection, at=at, tree=True), frames, items)
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
                    for member, version, last in runs[:TREE_RUNS]
                ],
                "runs_left_out": max(len(runs) - TREE_RUNS, 0),
                **shown.fields(projection),
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
    _show(out, projection, shown)


def _tree_member(engine: Engine, run_id: UUID, at: datetime | None) -> tuple[UUID, int, int]:
    """A run of the tree, the last of its events folded (by `at`) and its last event."""
    last = engine.store.last(run_id)
    last_version = 0 if last is None else last.version
    if at is None:
        return run_id, last_version, last_version
    return run_id, version_at(engine.store, run_id, at, last_version, "at"), last_version


def _show(out: Output, projection: Projection[Any], shown: Shown) -> None:
    if isinstance(shown.state, Stack):
        _stack_table(out, shown.state, shown.left_out)
    else:
        encoded, left_out = shown.encoded(projection)
        _json_block(out, encoded)
        if left_out:
            out.line(
                f"… {left_out:,} entries not shown: --items N shows N of each list or mapping,"
                " --items all every one",
                "dim",
            )


def _stack_table(out: Output, stack: Stack, left_out: int) -> None:
    """The frames shown, numbered by depth; a line says how many older ones were left out."""
    if stack.current is None:  # only before RunStarted: version 0, or a tree before its start
        out.line("no state yet: the run had not started (its first event, RunStarted, starts it)")
        return
    out.line(f"current state: {stack.current}, depth {stack.depth + left_out}")
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
        for depth, frame in enumerate(stack.frames, start=left_out + 1)
    ]
    out.table(
        ["#", "v", "state", "stage", "outcome", "try", "took", "result or error"],
        rows,
        styles=["red" if frame.failed else None for frame in stack.frames],
        right=(0, 1, 5, 6),
    )
    if left_out:
        older = (
            "1 older frame (#1)"
            if left_out == 1
            else f"{left_out:,} older frames (#1 to #{left_out:,})"
        )
        out.line(
            f"… {older} not shown: --frames N shows the newest N, --frames all every one",
            "dim",
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
