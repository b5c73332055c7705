"""`stagetrail replay`: each event, and what it changed in the machine state and the stack."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any
from uuid import UUID

from engine.cli.common import (
    STATUS_STYLES,
    BadOption,
    Output,
    json_line,
    say_left_out,
    window_end,
    write_lines,
)
from engine.cli.show import detail, is_decision
from engine.errors import RunNotFound
from events import Event
from projections import Frame, RunIndex, RunSummary, Stack, StateStack

if TYPE_CHECKING:
    from engine.engine import Engine

POPPED_SHOWN = 20
"""Frames a rollback popped that a replay step lists, newest first (the rest are counted)."""


def frame_json(frame: Frame) -> dict[str, Any]:
    """The parts of a stack frame a replay shows."""
    return {
        "state": frame.state,
        "stage": frame.stage,
        "outcome": frame.outcome,
        "attempt": frame.attempt,
        "failed": frame.failed,
        "version": frame.version,
    }


def frame_text(frame: Frame) -> str:
    """A frame in a few words: ``developer (developer failed #2)``."""
    return f"{frame.state} ({frame.stage} {frame.outcome} #{frame.attempt})"


class _Step:
    """One event and the states before and after it."""

    def __init__(
        self,
        event: Event,
        before: tuple[Stack, RunSummary | None],
        after: tuple[Stack, RunSummary | None],
    ) -> None:
        self.event = event
        self.stack_before, self.summary_before = before
        self.stack_after, self.summary_after = after

    def states(self) -> tuple[str | None, str | None]:
        return self.stack_before.current, self.stack_after.current

    def statuses(self) -> tuple[str | None, str | None]:
        before, after = self.summary_before, self.summary_after
        return (None if before is None else before.status), (
            None if after is None else after.status
        )

    def pushed(self) -> Frame | None:
        after = self.stack_after
        return after.top if after.depth > self.stack_before.depth else None

    def pushed_all(self) -> list[Frame]:
        """The frames the event pushed, oldest first: two for an outcome that took a hub's
        implicit route (the route's, then its own), else at most one."""
        grown = self.stack_after.depth - self.stack_before.depth
        if grown <= 0:
            return []
        return list(islice(self.stack_after.frame_list.newest_first(), grown))[::-1]

    def lost(self) -> int:
        """How many frames the event popped."""
        return max(self.stack_before.depth - self.stack_after.depth, 0)

    def popped(self) -> list[Frame]:
        """The frames the event popped, newest first: at most `POPPED_SHOWN` of them."""
        frames = self.stack_before.frame_list.newest_first()
        return list(islice(frames, min(self.lost(), POPPED_SHOWN)))

    def to_json(self) -> dict[str, Any]:
        pushed = self.pushed()
        return {
            "version": self.event.version,
            "event": type(self.event).__name__,
            "decision": is_decision(self.event),
            "state": list(self.states()),
            "status": list(self.statuses()),
            "depth": [self.stack_before.depth, self.stack_after.depth],
            "pushed": None if pushed is None else frame_json(pushed),
            "pushed_frames": [frame_json(frame) for frame in self.pushed_all()],
            "popped": [frame_json(frame) for frame in self.popped()],
            "popped_left_out": max(self.lost() - POPPED_SHOWN, 0),
        }

    def changes(self) -> list[str]:
        lines = []
        before, after = self.states()
        if before != after:
            lines.append(f"state   {before} -> {after}")
        pushed = "; ".join(frame_text(frame) for frame in self.pushed_all())
        if pushed:
            lines.append(f"stack   push {pushed}, depth {self.stack_after.depth}")
        popped = self.popped()
        if popped:
            undone = "; ".join(frame_text(frame) for frame in popped)
            more = self.lost() - len(popped)
            undone += f" and {more:,} more" if more else ""
            lines.append(f"stack   pop {undone}, depth {self.stack_after.depth}")
        old, new = self.statuses()
        if old is not None and old != new:
            lines.append(f"status  {old} -> {new}")
        return lines


def _steps(engine: Engine, run_id: UUID, start: int, end: int) -> Iterator[_Step]:
    stacks, index = StateStack(), RunIndex()
    stack: Stack = engine.project(run_id, stacks, at=start - 1)
    summary: RunSummary | None = engine.project(run_id, index, at=start - 1)
    for event in engine.store.stream(run_id, gt=start - 1, lte=end):
        new_stack, new_summary = stacks.apply(stack, event), index.apply(summary, event)
        yield _Step(event, (stack, summary), (new_stack, new_summary))
        stack, summary = new_stack, new_summary


def replay(
    engine: Engine, run_id: UUID, start: int, end: int, wanted: int | None = None, *, as_json: bool
) -> None:
    """Print each event of `start`..`end` and what it changed (JSON Lines with `as_json`).

    Then, if `wanted` goes past `end`, a line saying which events were left out.
    """
    steps = _steps(engine, run_id, start, end)
    wanted = end if wanted is None else wanted
    if as_json:
        write_lines(json_line(step.to_json()) for step in steps)
        say_left_out(None, end, wanted)
        return
    out = Output()
    out.line(f"run {run_id}: events {start} to {end}", "bold")
    width = len(str(end))
    for step in steps:
        event = step.event
        where = " ".join(str(getattr(event, name, "")) for name in ("stage", "outcome")).strip()
        parts = [f"{event.version:>{width}}", f"{type(event).__name__:<17}", where, detail(event)]
        out.line("  ".join(part for part in parts if part).rstrip(), _style(step))
        for change in step.changes():
            out.line(" " * (width + 4) + change, "cyan")
    say_left_out(out, end, wanted)


def _style(step: _Step) -> str | None:
    status = step.statuses()[1]
    if status is not None and status != "running":
        return "bold " + STATUS_STYLES.get(status, "")
    return "bold yellow" if is_decision(step.event) else "bold"


def replay_run(
    engine: Engine,
    run_id: UUID,
    start: int,
    stop: int | None,
    limit: int | None = None,
    *,
    as_json: bool,
) -> None:
    """Step through events `start`..`stop`, at most `limit` of them, printing what each changed."""
    last = engine.store.last(run_id)
    if last is None:
        raise RunNotFound(run_id, engine.url)
    end = last.version if stop is None else min(stop, last.version)
    if start > end:
        raise BadOption("--from", start, f"after --to / the run's last event ({end})")
    replay(engine, run_id, start, window_end(start, end, limit), end, as_json=as_json)
