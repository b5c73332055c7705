"""`stagetrail show` and `stagetrail replay`: a run's events, streamed page by page."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from uuid import UUID

from engine.cli.common import (
    STATUS_STYLES,
    BadOption,
    Output,
    clean,
    clock,
    compact,
    json_line,
    say_left_out,
    seconds,
    short,
    when,
    window_end,
    write_lines,
)
from engine.errors import RunNotFound
from engine.payloads import summary as payload_summary
from events import (
    BudgetSpent,
    CheckpointSaved,
    CheckpointsRemoved,
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    Event,
    NoteAdded,
    ProgressObserved,
    RetryScheduled,
    RunFinished,
    RunStarted,
    StageCompleted,
    StageFailed,
    StateRolledBack,
    TaskAdded,
    TaskCompleted,
    TaskFailed,
    WritesSaved,
    encode,
    task_writes,
)
from projections import RunIndex, RunSummary

if TYPE_CHECKING:
    from engine.engine import Engine

DECISION_EVENTS = (
    RetryScheduled,
    CircuitOpened,
    CircuitHalfOpened,
    CircuitClosed,
    RunFinished,
    StateRolledBack,
)
"""Events that record a decision: marked with ``*`` and highlighted."""

DECISION_NOTES = frozenset({"gave_up", "circuit_rejected", "progress_verdict"})
"""Keys of the notes in which the supervisor records a decision."""


def is_decision(event: Event) -> bool:
    """Whether `event` records a decision (a decision event, or a supervisor's note)."""
    if isinstance(event, NoteAdded):
        return event.key in DECISION_NOTES
    if type(event) is StageCompleted and not event.attempt:
        return True  # an outcome the supervisor decided: a routed verdict
    return isinstance(event, DECISION_EVENTS)


_EVENT_WIDTH = 17  # len("CircuitHalfOpened")
_DETAIL_WIDTH = 70


def event_json(event: Event) -> dict[str, Any]:
    """An event as one flat JSON object: run_id, version, timestamp, event, decision, fields."""
    _, state = encode(event)
    state.pop("class_version", None)
    timestamp = state.pop("timestamp")
    return {
        "run_id": str(event.run_id),
        "version": event.version,
        "timestamp": timestamp,
        "event": type(event).__name__,
        "decision": is_decision(event),
        **state,
    }


def detail(event: Event) -> str:
    """What an event says, in a few words: a result, an error, a reason."""
    text = _detail(event)
    return compact(text, _DETAIL_WIDTH) if text else ""


def _detail(event: Event) -> str:
    describe = _DESCRIBE.get(type(event))
    return describe(event) if describe is not None else str(getattr(event, "task_id", ""))


def _completed(event: StageCompleted) -> str:
    carried = task_writes(event.result)
    if carried is not None:  # a graph node's writes, decoded (engine.payloads)
        result = compact(payload_summary(event) or "", 50)
    else:
        result = "" if event.result is None else compact(event.result, 50)
    if not event.attempt:  # a verdict the supervisor routed: the stage did not run
        return f"routed, not run: {result}".strip()
    return f"{result} in {seconds(event.duration)}".strip()


def _failed(event: StageFailed) -> str:
    retry = "" if event.retryable else " (not retryable)"
    # A graph node's writes hold the error again, as bytes: the line has it already.
    shown = event.details is not None and task_writes(event.details) is None
    details = f" {compact(event.details, 50)}" if shown else ""
    return f"{event.error_type}: {event.error}{retry}{details}"


def _retry(event: RetryScheduled) -> str:
    why = f": {event.reason}" if event.reason else ""
    return f"attempt {event.attempt} in {seconds(event.delay)}{why}"


def _rolled_back(event: StateRolledBack) -> str:
    return f"undo {event.steps}: {event.reason}" if event.reason else f"undo {event.steps}"


def _finished(event: RunFinished) -> str:
    return f"{event.status}: {reason_line(event.reason)}" if event.reason else event.status


def _task_added(event: TaskAdded) -> str:
    parent = f" under {event.parent_id}" if event.parent_id else ""
    return f"{event.task_id}{parent}: {event.title}" if event.title else event.task_id + parent


def _started(event: RunStarted) -> str:
    parts = [event.pipeline]
    if event.params:
        parts.append(f"params {compact(event.params, 40)}")
    if event.labels:
        parts.append(" ".join(f"{k}={v}" for k, v in sorted(event.labels.items())))
    if event.parent_run_id is not None:
        parts.append(f"child of {short(event.parent_run_id)}")
    if event.forked_from is not None:
        parts.append(f"fork of {short(event.forked_from[0])} at {event.forked_from[1]}")
    return ", ".join(parts)


def _progress(event: ProgressObserved) -> str:
    """The signals an observation carries; the ones it does not observe are left out."""
    changed = event.changed_files
    parts = []
    if changed is not None:
        parts.append(f"{len(changed) if isinstance(changed, list) else changed} files changed")
    if event.test_signature is not None:
        parts.append(f"tests {event.test_signature}" if event.test_signature else "tests pass")
    if event.diagnostics_signature is not None:
        diagnostics = event.diagnostics_signature
        parts.append(f"diagnostics {diagnostics}" if diagnostics else "no diagnostics")
    if event.functional_ok is not None:
        parts.append("functional" if event.functional_ok else "not functional")
    return ", ".join(parts) or "nothing observed"


_DESCRIBE: dict[type[Any], Callable[[Any], str]] = {
    CheckpointSaved: lambda e: payload_summary(e) or "",
    WritesSaved: lambda e: payload_summary(e) or "",
    CheckpointsRemoved: lambda e: f"{len(e.removed)} checkpoint(s): {e.reason}",
    RunStarted: _started,
    StageCompleted: _completed,
    StageFailed: _failed,
    RetryScheduled: _retry,
    CircuitOpened: lambda e: e.reason,
    CircuitHalfOpened: lambda e: e.reason,
    CircuitClosed: lambda e: e.reason,
    StateRolledBack: _rolled_back,
    RunFinished: _finished,
    ProgressObserved: _progress,
    TaskAdded: _task_added,
    TaskCompleted: lambda e: f"{e.task_id}: {compact(e.result, 50)}",
    TaskFailed: lambda e: f"{e.task_id}: {e.error_type}: {e.error}",
    BudgetSpent: lambda e: f"{e.amount:g} {e.unit}",
    NoteAdded: lambda e: f"{e.key} = {compact(e.value, 50)}",
}


def reason_line(reason: Any) -> str:
    """A finish reason on one line: ``rule=max_same_error, steps=12``, or the text itself."""
    if isinstance(reason, dict):
        return ", ".join(f"{key}={compact(value, 40)}" for key, value in reason.items())
    return compact(reason, 80)


def reason_lines(reason: Any) -> list[str]:
    """A finish reason for the closing lines: one ``key: value`` line per field of a dict."""
    if isinstance(reason, dict):
        return [f"  {key}: {_shown(value)}" for key, value in reason.items()]
    return [f"  {compact(reason, 1000)}"] if reason not in (None, "") else []


def _shown(value: Any) -> str:
    """A reason's value on its line; an empty string shows as "" rather than as nothing."""
    return '""' if value == "" else compact(value, 1000)


class _Columns:
    """Fixed column widths for one run, from its table, so lines stream without buffering."""

    def __init__(self, first: RunStarted, last_version: int) -> None:
        table: Any = first.table
        rows = table.get("transitions", []) if isinstance(table, dict) else []
        # Widths of the names as shown: a control character takes 4 columns (\x1b).
        stages = [clean(str(row[0]), one_line=True) for row in rows]
        stages += [clean(str(row[2]), one_line=True) for row in rows]
        self.version = max(len(str(last_version)), 1)
        self.stage = max([5, *(len(s) for s in stages)])
        self.outcome = max([7, *(len(clean(str(row[1]), one_line=True)) for row in rows)])

    def header(self) -> str:
        return self.line(" ", "v", "time", "event", "stage", "try", "outcome", "detail")

    def row(self, event: Event) -> str:
        attempt = getattr(event, "attempt", None)
        return self.line(
            "*" if is_decision(event) else " ",
            str(event.version),
            clock(event.timestamp),
            type(event).__name__,
            clean(str(getattr(event, "stage", "")), one_line=True),
            "" if attempt is None else str(attempt) if attempt else "-",
            clean(str(getattr(event, "outcome", "")), one_line=True),
            detail(event),
        )

    def line(self, *cells: str) -> str:
        mark, version, time, name, stage, attempt, outcome, text = cells
        return (
            f"{mark}{version:>{self.version}}  {time:<12}  {name:<{_EVENT_WIDTH}}  "
            f"{stage:<{self.stage}}  {attempt:>3}  {outcome:<{self.outcome}}  {text}"
        ).rstrip()


def _style(event: Event) -> str | None:
    if isinstance(event, RunFinished):
        return "bold " + STATUS_STYLES.get(event.status, "")
    if is_decision(event):
        return "bold yellow"
    if isinstance(event, StageFailed | TaskFailed):
        return "red"
    return None


def show_run(
    engine: Engine, run_id: UUID, *, start: int = 1, limit: int | None = None, as_json: bool
) -> None:
    """Print the run's timeline (or its events as JSON Lines), streamed from the store.

    At most `limit` events from `start` (None: to the end); a closing line says
    which were left out (on stderr beside JSON Lines).
    """
    last = engine.store.last(run_id)
    if last is None:
        raise RunNotFound(run_id, engine.url)
    if start > last.version:
        raise BadOption("--from", start, f"after the run's last event ({last.version})")
    end = window_end(start, last.version, limit)
    events = engine.store.stream(run_id, gt=start - 1, lte=end)
    if as_json:
        write_lines(json_line(event_json(event)) for event in events)
        say_left_out(None, end, last.version)
        return
    first = next(engine.store.stream(run_id, lte=1)) if start > 1 else next(events)
    if not isinstance(first, RunStarted):
        raise BadOption("RUN", str(run_id), "the run does not begin with RunStarted")
    out, columns = Output(), _Columns(first, last.version)
    _heading(out, columns, first, start)
    whole = start == 1 and end == last.version
    index = RunIndex()
    summary = index.apply(index.initial(), first) if whole else None
    summary = _rows(out, columns, events, index if whole else None, summary)
    say_left_out(out, end, last.version)
    if not whole:  # the window folded only part of the run: its summary comes from the store
        summary = engine.project(run_id, index)
    _closing(out, summary)


def _heading(out: Output, columns: _Columns, first: RunStarted, start: int) -> None:
    """The run's line, the events before the window if any, the column header, event 1."""
    run_id = first.run_id
    out.line(f"run {run_id}  {first.pipeline}  started {when(first.timestamp)} UTC", "bold")
    if start > 1:
        out.line(f"(events 1 to {start - 1:,} not shown: --from 1 shows them)", "dim")
    out.line(columns.header(), "dim", crop=True)
    if start == 1:
        out.line(columns.row(first), crop=True)


def _rows(
    out: Output,
    columns: _Columns,
    events: Iterator[Event],
    index: RunIndex | None,
    summary: RunSummary | None,
) -> RunSummary | None:
    """Print a row per event; fold `index` along (when given: the window is the whole run)."""
    if out.terminal:
        for event in events:
            summary = summary if index is None else index.apply(summary, event)
            out.line(columns.row(event), _style(event), crop=True)
        return summary
    if index is None:
        write_lines(columns.row(event) for event in events)
        return summary
    return _plain_rows(columns, index, summary, events)


def _plain_rows(
    columns: _Columns, index: RunIndex, summary: RunSummary | None, events: Iterable[Event]
) -> RunSummary | None:
    folded = [summary]

    def rows() -> Iterator[str]:
        state, apply, row = folded[0], index.apply, columns.row
        for event in events:
            state = apply(state, event)
            yield row(event)
        folded[0] = state

    write_lines(rows())
    return folded[0]


def _closing(out: Output, summary: RunSummary | None) -> None:
    if summary is None:
        return
    counts = (
        f"state {summary.state}, {summary.version} events, "
        f"{summary.attempts} attempts, {summary.failures} failures"
    )
    took = "" if summary.finished is None else f", took {seconds(summary.duration)}"
    out.line(f"status: {summary.status} ({counts}{took})", STATUS_STYLES.get(summary.status))
    lines = reason_lines(summary.reason)
    if lines:
        out.line("reason:")
        for line in lines:
            out.line(line)
