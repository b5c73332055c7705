"""`stagetrail diff`: what differs between two points of a run, or between two runs."""

from __future__ import annotations

from collections import Counter
from itertools import zip_longest
from typing import TYPE_CHECKING, Any
from uuid import UUID

import attrs

from engine.cli.common import BadOption, Output, compact, print_json, short
from engine.cli.replay import frame_json, frame_text
from engine.cli.show import event_json
from engine.errors import RunNotFound
from projections import FailurePatterns, Frame, RetryCounts, RunIndex, StateStack, TaskTable

if TYPE_CHECKING:
    from engine.engine import Engine

_SHOWN_FRAMES = 6
JSON_FRAMES = 20
"""Frames of each side past the common ones that --json lists (the rest are counted)."""
_LINEAGE = ("run_id", "timestamp", "forked_from", "parent_run_id")


@attrs.frozen
class Point:
    """A run after one of its events."""

    run_id: UUID
    version: int
    last: int

    def label(self) -> str:
        """``run 1a2b3c4d after event 8 of 17``."""
        return f"run {short(self.run_id)} after event {self.version} of {self.last}"

    def to_json(self) -> dict[str, Any]:
        """The point as JSON."""
        return {"run_id": str(self.run_id), "version": self.version, "last_version": self.last}


def _point(engine: Engine, run_id: UUID, version: int | None) -> Point:
    last = engine.store.last(run_id)
    if last is None:
        raise RunNotFound(run_id, engine.url)
    at = last.version if version is None else min(version, last.version)
    return Point(run_id, at, last.version)


def facts(engine: Engine, point: Point) -> dict[str, Any]:
    """What the run looks like at `point`, as flat named values to compare."""
    run_id, at = point.run_id, point.version
    summary = engine.project(run_id, RunIndex, at=at)
    retries = engine.project(run_id, RetryCounts, at=at)
    failures = engine.project(run_id, FailurePatterns, at=at)
    stack = engine.project(run_id, StateStack, at=at)
    tasks = engine.project(run_id, TaskTable, at=at)
    found: dict[str, Any] = {
        "status": None if summary is None else summary.status,
        "state": stack.current,
        "stack depth": stack.depth,
        "attempts": retries.total_attempts,
        "failures": failures.total,
        "reason": None if summary is None else summary.reason or None,
    }
    for stage in sorted(retries.attempt_counts):
        found[f"attempts of {stage}"] = retries.attempts(stage)
        found[f"retries of {stage}"] = retries.retries(stage)
    for error_type, count in sorted(failures.by_error_type.items()):
        found[f"failures {error_type}"] = count
    for stage, result in sorted(stack.all_latest_results().items()):
        found[f"result of {stage}"] = result
    for status in ("completed", "failed", "pending", "active"):
        found[f"tasks {status}"] = len(getattr(tasks, status))
    for unit, amount in sorted(tasks.budget.items()):
        found[f"spent {unit}"] = amount
    return found


def _frame_key(frame: Frame) -> tuple[Any, ...]:
    return (frame.state, frame.stage, frame.outcome, frame.attempt, frame.result, frame.error)


def _stacks(engine: Engine, a: Point, b: Point) -> tuple[int, list[Frame], list[Frame]]:
    frames_a = engine.project(a.run_id, StateStack, at=a.version).frames
    frames_b = engine.project(b.run_id, StateStack, at=b.version).frames
    common = 0
    for frame_a, frame_b in zip(frames_a, frames_b, strict=False):
        if _frame_key(frame_a) != _frame_key(frame_b):
            break
        common += 1
    return common, list(frames_a[common:]), list(frames_b[common:])


def common_events(engine: Engine, a: Point, b: Point) -> int:
    """How many first events two runs share (same type and fields; times and lineage aside)."""
    shared = 0
    stream_a = engine.store.stream(a.run_id, lte=a.version)
    stream_b = engine.store.stream(b.run_id, lte=b.version)
    for event_a, event_b in zip_longest(stream_a, stream_b):
        if event_a is None or event_b is None or _comparable(event_a) != _comparable(event_b):
            break
        shared += 1
    return shared


def _comparable(event: Any) -> dict[str, Any]:
    data = event_json(event)
    for key in _LINEAGE:
        data.pop(key, None)
    return data


def _between(engine: Engine, a: Point, b: Point) -> dict[str, int]:
    low, high = sorted((a.version, b.version))
    kinds = Counter(type(e).__name__ for e in engine.store.stream(a.run_id, gt=low, lte=high))
    return dict(sorted(kinds.items()))


def diff_points(
    engine: Engine,
    run_id: UUID,
    other: UUID | None,
    start: int | None,
    stop: int | None,
    *,
    as_json: bool,
) -> None:
    """Compare two points of one run (`start`, `stop`) or the ends of two runs."""
    if other is None and start is None:
        raise BadOption("--from", None, "give --from N (and --to M), or a second run")
    if other is not None and (start is not None or stop is not None):
        raise BadOption("--from/--to", f"{start}/{stop}", "compare two runs at their ends only")
    a = _point(engine, run_id, start)
    b = _point(engine, run_id if other is None else other, stop)
    facts_a, facts_b = facts(engine, a), facts(engine, b)
    differences = [
        {"key": key, "a": facts_a.get(key), "b": facts_b.get(key)}
        for key in dict.fromkeys([*facts_a, *facts_b])
        if facts_a.get(key) != facts_b.get(key)
    ]
    common, only_a, only_b = _stacks(engine, a, b)
    report: dict[str, Any] = {"a": a.to_json(), "b": b.to_json()}
    if other is None:
        report["events_between"] = _between(engine, a, b)
    else:
        report["common_events"] = common_events(engine, a, b)
    report["common_frames"] = common
    for name, only in (("frames_a", only_a), ("frames_b", only_b)):
        report[name] = [frame_json(frame) for frame in only[:JSON_FRAMES]]
        report[f"{name}_left_out"] = max(len(only) - JSON_FRAMES, 0)
    report["differences"] = differences
    if as_json:
        print_json(report)
    else:
        _print(Output(), a, b, report, (only_a, only_b))


def _print(
    out: Output, a: Point, b: Point, report: dict[str, Any], frames: tuple[list[Frame], ...]
) -> None:
    out.line(f"A: {a.label()}", "bold")
    out.line(f"B: {b.label()}", "bold")
    if "events_between" in report:
        kinds = ", ".join(f"{n} {kind}" for kind, n in report["events_between"].items())
        low, high = sorted((a.version, b.version))
        out.line(f"events {low + 1} to {high}: {kinds or 'none'}")
    else:
        shared = report["common_events"]
        out.line(f"history: the first {shared} events are the same (times and lineage aside)")
    shared = report["common_frames"]
    out.line(f"stack: {shared} frame{'' if shared == 1 else 's'} in common, then")
    for name, only in zip("AB", frames, strict=True):
        shown = ", ".join(frame_text(frame) for frame in only[:_SHOWN_FRAMES])
        more = f" and {len(only) - _SHOWN_FRAMES} more" if len(only) > _SHOWN_FRAMES else ""
        out.line(f"  {name}: {shown or '(nothing)'}{more}")
    if not report["differences"]:
        out.line("no differences in state, status, counts or results")
        return
    rows = [[row["key"], _cell(row["a"]), _cell(row["b"])] for row in report["differences"]]
    out.table(["", "A", "B"], rows)


def _cell(value: Any) -> str:
    return "-" if value is None else compact(value, 40)
