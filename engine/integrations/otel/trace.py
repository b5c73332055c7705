"""A run as a trace, folded from its events: the pure part of the OpenTelemetry export.

`step(state, event)` returns the run's trace state after `event` and the spans the
event ended: an attempt's span at its outcome, a task's at its end, the run's own
span (with every retry, breaker change, rollback and verdict as a span event) at
`RunFinished`. `flush` ends what is still open, for a run exported before it
finished. Nothing here knows OpenTelemetry's classes (see `sdk.py`); the state is
plain JSON, so it is a persistent projection's state as it is.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import attrs

from events import (
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    Event,
    RetryScheduled,
    RunFinished,
    RunStarted,
    StageCompleted,
    StageFailed,
    StageStarted,
    StateRolledBack,
    TaskCompleted,
    TaskFailed,
    TaskStarted,
)

Attributes = dict[str, str | bool | int | float]
State = dict[str, Any] | None
"""A run's trace state (plain JSON): None before its `RunStarted`."""

SPAN_EVENTS = 128
"""Span events the run's span keeps (OpenTelemetry's default limit); later ones are counted."""
ERROR_TEXT = 2000
"""Characters of an error message a span keeps."""
_FAILED = frozenset({"failed", "aborted_stuck", "cancelled"})


@attrs.frozen
class SpanRecord:
    """One span of a run's trace, before it is given OpenTelemetry's ids and classes.

    `key` names the span within its run (``run``, ``attempt:<version>``,
    ``task:<version>``); its parent is the run's span, or for a run's span the
    parent run's span (a child run), or none.
    """

    run_id: str
    key: str
    parent_run_id: str | None
    name: str
    start: datetime
    end: datetime
    attributes: Attributes
    events: tuple[tuple[str, datetime, Attributes], ...] = ()
    error: str | None = None
    forked_from: tuple[str, int] | None = None

    @property
    def parent_key(self) -> tuple[str, str] | None:
        """(run, key) of the parent span, or None for a trace's root."""
        if self.key != "run":
            return (self.run_id, "run")
        return None if self.parent_run_id is None else (self.parent_run_id, "run")


def step(state: State, event: Event) -> tuple[State, list[SpanRecord]]:
    """The run's trace state after `event`, and the spans `event` ended."""
    if isinstance(event, RunStarted):
        return _started(event), []
    if state is None or state.get("finished"):
        return state, []  # a run begun before what was folded, or events after its end
    handler = _STEPS.get(type(event))
    if handler is None:
        return {**state, "last": _time(event)}, []
    return handler(state, event)  # type: ignore[no-any-return]


def flush(state: State) -> list[SpanRecord]:
    """The spans still open in `state` (attempts, tasks, the run), ended at its newest event."""
    if state is None or state.get("finished"):
        return []
    end = _parse(state["last"])
    spans = [_open_attempt(state, stage, end) for stage in sorted(state["open"])]
    spans += [_open_task(state, task_id, end) for task_id in sorted(state["tasks"])]
    return [*spans, _run_span(state, end, "running", "")]


def _started(event: RunStarted) -> dict[str, Any]:
    return {
        "run": str(event.run_id),
        "parent": None if event.parent_run_id is None else str(event.parent_run_id),
        "forked_from": None
        if event.forked_from is None
        else [str(event.forked_from[0]), event.forked_from[1]],
        "pipeline": event.pipeline,
        "labels": dict(event.labels),
        "started": _time(event),
        "last": _time(event),
        "open": {},
        "tasks": {},
        "events": [],
        "dropped": 0,
        "attempts": 0,
        "failures": 0,
        "finished": False,
    }


def _stage_started(state: dict[str, Any], event: StageStarted) -> tuple[State, list[SpanRecord]]:
    opened = {**state["open"], event.stage: [event.attempt, _time(event), event.version]}
    return {**state, "open": opened, "last": _time(event)}, []


def _outcome(
    state: dict[str, Any], event: StageCompleted | StageFailed
) -> tuple[State, list[SpanRecord]]:
    opened = dict(state["open"])
    began = opened.pop(event.stage, None)
    start = event.timestamp - timedelta(seconds=max(event.duration, 0.0))
    if began is not None and began[0] == event.attempt:
        start = _parse(began[1])
    failed = isinstance(event, StageFailed)
    attributes: Attributes = {
        "stagetrail.stage": event.stage,
        "stagetrail.attempt": event.attempt,
        "stagetrail.outcome": event.outcome,
        "stagetrail.duration": event.duration,
        "stagetrail.version": event.version,
    }
    error = None
    if isinstance(event, StageFailed):
        attributes["error.type"] = event.error_type
        attributes["stagetrail.retryable"] = event.retryable
        error = event.error[:ERROR_TEXT]
    span = SpanRecord(
        state["run"], f"attempt:{event.version}", None,
        f"{event.stage} #{event.attempt}", start, event.timestamp, attributes, error=error,
    )  # fmt: skip
    changed = {
        **state,
        "open": opened,
        "last": _time(event),
        "attempts": state["attempts"] + 1,
        "failures": state["failures"] + failed,
    }
    return changed, [span]


def _span_event(name: str, *fields: str) -> Any:
    def handler(state: dict[str, Any], event: Event) -> tuple[State, list[SpanRecord]]:
        attributes = {f"stagetrail.{f}": _attribute(getattr(event, f)) for f in fields}
        attributes["stagetrail.version"] = event.version
        return _with_event(state, name, event, attributes), []

    return handler


def _with_event(
    state: dict[str, Any], name: str, event: Event, attributes: Attributes
) -> dict[str, Any]:
    recorded = state["events"]
    if len(recorded) >= SPAN_EVENTS:
        return {**state, "dropped": state["dropped"] + 1, "last": _time(event)}
    return {**state, "events": [*recorded, [name, _time(event), attributes]], "last": _time(event)}


def _task_started(state: dict[str, Any], event: TaskStarted) -> tuple[State, list[SpanRecord]]:
    tasks = {**state["tasks"], event.task_id: [_time(event), event.version]}
    return {**state, "tasks": tasks, "last": _time(event)}, []


def _task_ended(
    state: dict[str, Any], event: TaskCompleted | TaskFailed
) -> tuple[State, list[SpanRecord]]:
    tasks = dict(state["tasks"])
    began = tasks.pop(event.task_id, None)
    start = event.timestamp if began is None else _parse(began[0])
    error = event.error[:ERROR_TEXT] if isinstance(event, TaskFailed) else None
    attributes: Attributes = {
        "stagetrail.task_id": event.task_id,
        "stagetrail.version": event.version,
    }
    if isinstance(event, TaskFailed):
        attributes["error.type"] = event.error_type
    span = SpanRecord(
        state["run"], f"task:{event.version}", None, f"task {event.task_id}",
        start, event.timestamp, attributes, error=error,
    )  # fmt: skip
    return {**state, "tasks": tasks, "last": _time(event)}, [span]


def _finished(state: dict[str, Any], event: RunFinished) -> tuple[State, list[SpanRecord]]:
    reason = _attribute(event.reason)
    verdict: Attributes = {"stagetrail.status": event.status, "stagetrail.reason": reason}
    verdict["stagetrail.version"] = event.version
    state = _with_event(state, "verdict", event, verdict)
    end = event.timestamp
    spans = [_open_attempt(state, stage, end, interrupted=True) for stage in sorted(state["open"])]
    spans += [
        _open_task(state, task_id, end, interrupted=True) for task_id in sorted(state["tasks"])
    ]
    spans.append(_run_span(state, end, event.status, str(reason)))
    return {**state, "open": {}, "tasks": {}, "finished": True}, spans


def _open_attempt(
    state: dict[str, Any], stage: str, end: datetime, *, interrupted: bool = False
) -> SpanRecord:
    attempt, began, version = state["open"][stage]
    attributes: Attributes = {
        "stagetrail.stage": stage,
        "stagetrail.attempt": attempt,
        "stagetrail.version": version,
        "stagetrail.interrupted" if interrupted else "stagetrail.open": True,
    }
    return SpanRecord(
        state["run"], f"attempt:{version}", None, f"{stage} #{attempt}",
        _parse(began), end, attributes,
    )  # fmt: skip


def _open_task(
    state: dict[str, Any], task_id: str, end: datetime, *, interrupted: bool = False
) -> SpanRecord:
    began, version = state["tasks"][task_id]
    attributes: Attributes = {
        "stagetrail.task_id": task_id,
        "stagetrail.version": version,
        "stagetrail.interrupted" if interrupted else "stagetrail.open": True,
    }
    return SpanRecord(
        state["run"], f"task:{version}", None, f"task {task_id}", _parse(began), end, attributes
    )


def _run_span(state: dict[str, Any], end: datetime, status: str, reason: str) -> SpanRecord:
    attributes: Attributes = {
        "stagetrail.run_id": state["run"],
        "stagetrail.pipeline": state["pipeline"],
        "stagetrail.status": status,
        "stagetrail.attempts": state["attempts"],
        "stagetrail.failures": state["failures"],
    }
    for key, value in sorted(state["labels"].items()):
        attributes[f"stagetrail.label.{key}"] = value
    if state["parent"] is not None:
        attributes["stagetrail.parent_run_id"] = state["parent"]
    if state["dropped"]:
        attributes["stagetrail.span_events_dropped"] = state["dropped"]
    forked = state["forked_from"]
    if forked is not None:
        attributes["stagetrail.forked_from"] = f"{forked[0]}@{forked[1]}"
    events = tuple((name, _parse(at), dict(attrs_)) for name, at, attrs_ in state["events"])
    error = (reason or status)[:ERROR_TEXT] if status in _FAILED else None
    return SpanRecord(
        state["run"], "run", state["parent"], f"run {state['pipeline']}",
        _parse(state["started"]), end, attributes, events, error,
        None if forked is None else (forked[0], forked[1]),
    )  # fmt: skip


def _attribute(value: Any) -> str | bool | int | float:
    if isinstance(value, str | bool | int | float):
        return value
    import json

    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _time(event: Event) -> str:
    return event.timestamp.isoformat()


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


_STEPS: dict[type[Event], Any] = {
    StageStarted: _stage_started,
    StageCompleted: _outcome,
    StageFailed: _outcome,
    RetryScheduled: _span_event("retry_scheduled", "stage", "attempt", "delay", "reason"),
    CircuitOpened: _span_event("circuit_opened", "stage", "reason"),
    CircuitHalfOpened: _span_event("circuit_half_opened", "stage", "reason"),
    CircuitClosed: _span_event("circuit_closed", "stage", "reason"),
    StateRolledBack: _span_event("rolled_back", "steps", "reason"),
    TaskStarted: _task_started,
    TaskCompleted: _task_ended,
    TaskFailed: _task_ended,
    RunFinished: _finished,
}
