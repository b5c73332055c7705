"""What the time slider shows at a version: the built-in projections' states, as JSON.

The states come from the projections themselves, folded side by side by
`RunView` (each event is read and decoded once for the five of them):
`at_version` asks `engine.project(run_id, RunView, at=N)` (what the JSON API
serves, from the engine's snapshots), `every_state` folds the same `RunView`
once over a window of events (what the offline report embeds). Both go through
`view`, so the page draws the same either way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar
from uuid import UUID

from engine.payloads import readable_result
from engine.ui.timeline import attempt_seconds
from events import JSON, Event
from projections import (
    Frame,
    ProgressState,
    Projection,
    ProjectionError,
    Results,
    RetryCounts,
    RunIndex,
    RunSummary,
    Stack,
    StageResults,
    StateStack,
)
from projections.base import EventSource, Folding, folding, folds_faster, folds_with

if TYPE_CHECKING:
    from engine.engine import Engine

PANELS: Mapping[str, type[Projection[Any]]] = {
    "summary": RunIndex,
    "stack": StateStack,
    "results": StageResults,
    "retries": RetryCounts,
    "progress": ProgressState,
}
"""Each panel of the run page and the projection it shows."""

SHOWN_FRAMES = 100
"""The newest frames of the stack a view holds; deeper ones are counted, not listed."""

KEPT_EVERY = 100
"""Events between two views the viewer keeps in memory: a slider move to a version never
asked before folds at most this many events (the engine's snapshots lie further apart)."""

_PARTS: tuple[Projection[Any], ...] = tuple(cls() for cls in PANELS.values())

_Step = tuple[int, Projection[Any], Callable[[Any, Any, Any], Any] | None]
_STEPS: dict[type[Event], tuple[_Step, ...]] = {}
"""Per event class, the parts it may change: (index, part, its handler, or None to call the
part's own `apply`). A part without a handler for the class keeps its state untouched, as
its `apply` would: a fold then makes one call per part that reacts, not five."""


class RunView(Projection[tuple[Any, ...]]):
    """The panels' projections folded side by side: a tuple of their states, in `PANELS` order.

    Each part's handlers (or its own `apply`), `encode` and `decode` do the work; the
    fingerprints of the parts are a class constant, so a change to any of them discards
    the snapshots.
    """

    name: ClassVar[str] = "ui_run_view"
    scope: ClassVar[str] = "run"
    kept_every: ClassVar[int] = KEPT_EVERY
    PART_FINGERPRINTS: ClassVar[tuple[str, ...]] = tuple(
        cls.fingerprint() for cls in PANELS.values()
    )

    def initial(self) -> tuple[Any, ...]:
        """Each part's initial state."""
        return tuple(part.initial() for part in _PARTS)

    def apply(self, state: tuple[Any, ...], event: Event) -> tuple[Any, ...]:
        """Each part's state after `event` (only the parts the event's class may change)."""
        steps = _STEPS.get(type(event)) or self._steps(type(event))
        parts = list(state)
        for index, part, handler in steps:
            if handler is None:  # an `apply` of its own (it names its own errors)
                parts[index] = part.apply(parts[index], event)
                continue
            try:
                parts[index] = handler(part, parts[index], event)
            except Exception as error:
                raise ProjectionError(part.name, event, error) from error
        return tuple(parts)

    @staticmethod
    def _steps(kind: type[Event]) -> tuple[_Step, ...]:
        # A method, not a module function: its code is then part of the fingerprint, and
        # a change to which parts an event reaches discards the views stored before.
        steps: list[_Step] = []
        for index, part in enumerate(_PARTS):
            if type(part).apply is not Projection.apply or part.every_event:
                steps.append((index, part, None))
            elif (handler := part.handlers.get(kind)) is not None:
                steps.append((index, part, handler))
        _STEPS[kind] = found = tuple(steps)
        return found

    def encode(self, state: tuple[Any, ...]) -> JSON:
        """Each part's state as its own `encode` writes it."""
        return [part.encode(each) for part, each in zip(_PARTS, state, strict=True)]

    def decode(self, data: JSON) -> tuple[Any, ...]:
        """The states `encode` wrote."""
        return tuple(part.decode(each) for part, each in zip(_PARTS, data, strict=True))

    def snapshot(self, state: tuple[Any, ...]) -> JSON:
        """Each part's time-travel snapshot (a deep stack as its events' versions, not frames)."""
        return [part.snapshot(each) for part, each in zip(_PARTS, state, strict=True)]

    def restore(self, data: JSON, events: EventSource) -> tuple[Any, ...]:
        """The states `snapshot` wrote, each part's older items made when first walked."""
        return tuple(part.restore(each, events) for part, each in zip(_PARTS, data, strict=True))


@folding.register(RunView)
def _folding(projection: RunView, state: tuple[Any, ...] | None = None) -> Folding[tuple[Any, ...]]:
    """`folding` of the panels: each part fed the events through its own `fold` (the stretch
    folds of `RunIndex`, `RetryCounts` and `ProgressState`, the rows pushed in place of
    `StateStack` and `StageResults`), not five handlers per event.

    Each part's `fold`, not its `folding`: a reader asks for the state every `KEPT_EVERY`
    events, where the run index's `StretchFolding` (a writer's) would count its whole stack's
    runs each time."""
    kind, begun = type(projection), projection.initial() if state is None else state
    if (
        not folds_with(projection, RunView)
        or kind.fold is not Projection.fold
        or folds_faster(projection)
    ):
        return Folding(projection, begun)  # a subclass folding its own way: through `fold`
    return _Panels(projection, begun)


class _Panels(Folding[tuple[Any, ...]]):
    """A `RunView` fold fed its events in parts, each part folding them in a loop of its own."""

    def feed(self, events: Sequence[Event]) -> None:
        """Fold `events`, the next ones (raises as `Projection.fold` does: a failure is told
        again event by event, so it names the first event any part fails on)."""
        before = self._state
        try:
            self._state = tuple(
                part.fold(events, each) for part, each in zip(_PARTS, before, strict=True)
            )
        except Exception:  # a later part's error may lie before the one raised: `apply` says
            self._state = self.projection.fold(events, before)


def at_version(engine: Engine, run_id: UUID, version: int, last_version: int) -> dict[str, JSON]:
    """The view after event `version`, from ``engine.project(run_id, RunView, at=version)``."""
    states = engine.project(run_id, RunView, at=version)
    (event,) = engine.store.read(run_id, gt=version - 1, lte=version)
    shown = view(version, last_version, dict(zip(PANELS, states, strict=True)))
    return {**shown, "kind": type(event).__name__}


def every_state(
    events: Iterable[Event], versions: Iterable[int], initial: tuple[Any, ...] | None = None
) -> Iterator[tuple[int, Any]]:
    """The panels' states (by panel name) after each of `versions`, folding the events once.

    Args:
        initial: the `RunView` state before the first of `events` (default: the run's start).
    """
    projection = RunView()
    state = projection.initial() if initial is None else initial
    materialised = list(events)
    position = 0
    for version in sorted(set(versions)):
        while position < len(materialised) and materialised[position].version <= version:
            state = projection.apply(state, materialised[position])
            position += 1
        yield version, dict(zip(PANELS, state, strict=True))


def spaced_versions(last_version: int, limit: int) -> list[int]:
    """Every version 1..`last_version`, or `limit` of them evenly spaced (first and last kept)."""
    if last_version <= limit:
        return list(range(1, last_version + 1))
    step = (last_version - 1) / (limit - 1)
    return sorted({1 + round(index * step) for index in range(limit)})


def view(version: int, last_version: int, states: Mapping[str, Any]) -> dict[str, JSON]:
    """The JSON the page draws from the panels' projection states."""
    stack = stack_view(states["stack"])
    stack["frames"] = [frame_json(frame, n) for n, frame in shown_frames(states["stack"])]
    return {"version": version, "last_version": last_version, "stack": stack, **panels(states)}


def panels(states: Mapping[str, Any]) -> dict[str, JSON]:
    """The JSON of every panel but the stack's."""
    summary: RunSummary | None = states["summary"]
    return {
        "summary": None if summary is None else summary.to_json(),
        "results": _results(states["results"]),
        "retries": PANELS["retries"]().encode(states["retries"]),
        "progress": PANELS["progress"]().encode(states["progress"]),
    }


def stack_view(stack: Stack, limit: int = SHOWN_FRAMES) -> dict[str, Any]:
    """The stack's current state, depth and how many frames are not listed (no frames)."""
    shown = min(stack.depth, limit)
    return {"current": stack.current, "depth": stack.depth, "hidden": stack.depth - shown}


def shown_frames(stack: Stack, limit: int = SHOWN_FRAMES) -> list[tuple[int, Frame]]:
    """The newest `limit` frames, oldest first, each with its position from the bottom."""
    newest = list(itertools.islice(stack.frame_list.newest_first(), limit))
    first = stack.depth - len(newest) + 1
    return [(first + index, frame) for index, frame in enumerate(reversed(newest))]


def frame_key(frame: Frame) -> str:
    """What tells a frame from every other of its run: its event's version, and its stage
    (an outcome that took a hub's implicit route made two frames, the hub's and its own)."""
    return f"{frame.version}:{frame.stage}"


def frame_json(frame: Frame, position: int) -> dict[str, JSON]:
    """One frame of the stack, with its 1-based position from the bottom."""
    return {
        "n": position,
        "state": frame.state,
        "stage": frame.stage,
        "outcome": frame.outcome,
        "attempt": frame.attempt,
        "failed": frame.failed,
        "result": readable_result(frame.result),
        "error": frame.error,
        "error_type": frame.error_type,
        "duration": frame.duration,
        "took": attempt_seconds(frame.duration),
        "version": frame.version,
        "timestamp": frame.timestamp.isoformat(),
    }


def _results(results: Results) -> list[JSON]:
    """Per stage: attempts, the last attempt's outcome and time, the latest result.

    Read from the newest end of each stage's list, so a view costs the same at
    any length of run (the report makes thousands of them).
    """
    rows: list[JSON] = []
    for stage, attempts in results.by_stage.items():
        last = attempts.last
        if last is None:
            continue
        rows.append(
            {
                "stage": stage,
                "attempts": len(attempts),
                "last_outcome": last.outcome,
                "last_failed": last.failed,
                "last_seconds": last.duration,
                "last_took": attempt_seconds(last.duration),
                "latest": readable_result(results.latest(stage)),
            }
        )
    return rows
