"""`RunView` against the fold it replaced: every part given every event through its `apply`.

Random histories (the code-review table with a child run, a hub table and a strict one,
a rounds table, forks, rollbacks, tasks), their events also mixed across runs (an illegal
stream, where handlers raise) and with event classes of the user's own (a new topic, a
subclass of a handled class): every part's state after every event, or the error raised,
is the one main's `RunView.apply` gave.
"""

from __future__ import annotations

import contextlib
import copy
import random
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, Run, StagetrailError
from engine.ui.snapshot import PANELS, RunView
from events import DECIDED, Event, StageCompleted, StageStarted
from events.base import EVENT_TYPES
from projections import ProjectionError
from tests._helpers import REVIEW, hub_table
from tests.projections.test_projection_properties import act
from tests.projections.test_rounds import TOOL_LOOP


@attrs.frozen(kw_only=True)
class ReviewerPinged(Event):
    """An event class of the user's own, on a topic no projection handles."""

    topic = "tests:run_view_dispatch:ReviewerPinged"


@attrs.frozen(kw_only=True)
class LateCompleted(StageCompleted):
    """A subclass of a handled class, on a topic of its own (handlers match exact classes)."""

    topic = "tests:run_view_dispatch:LateCompleted"


# Folded here, never stored: out of the registry, which tests/events pins to the design's
# events (a module's classes register as it is collected, before any test runs).
for _cls in (ReviewerPinged, LateCompleted):
    del EVENT_TYPES[_cls.topic]


STAGES = ("a", "b", "b_done")
ROUTES = ("a", "b", "stop")

STEPS = st.lists(
    st.tuples(
        st.sampled_from(["review", "child", "hub", "strict", "rounds", "fork"]),
        st.sampled_from(
            [
                "completed",
                "failed",
                "start",
                "rollback",
                "add_task",
                "task_started",
                "task_completed",
                "task_failed",
                "spend",
                "progress",
                "note",
                "finish",
                "route",
                "stage_done",
                "stage_failed",
                "tool_call",
                "answered",
                "fork",
            ]
        ),
        st.integers(min_value=1, max_value=3),
    ),
    max_size=60,
)


def main_apply(state: tuple[Any, ...], event: Event) -> tuple[Any, ...]:
    """main's `RunView.apply`: every part's own `apply`, whatever the event's class."""
    parts = [cls() for cls in PANELS.values()]
    return tuple(part.apply(each, event) for part, each in zip(parts, state, strict=True))


def step(engine: Engine, runs: dict[str, Run], which: str, action: str, number: int) -> None:
    """Record one step on `runs[which]` (a fork from it for "fork"); illegal ones write nothing."""
    run = runs.get(which)
    if run is None:
        return
    with contextlib.suppress(StagetrailError):
        if action == "fork":
            runs["fork"] = engine.fork(run.id, at=min(number + 1, run.version))
        elif action == "route":
            run.record(StageCompleted, stage="hub", attempt=DECIDED, outcome=ROUTES[number - 1])
        elif action == "stage_done":
            run.stage_completed(STAGES[number - 1])
        elif action == "stage_failed":
            run.stage_failed(STAGES[number - 1], error=f"e{number}")
        elif action in ("tool_call", "answered"):
            run.stage_completed(run.state, outcome=action, result={"n": number})
        else:
            act(run, action, number)


def outcome(apply: Any, events: list[Event]) -> tuple[list[Any], Any]:
    """The state after each event, and what stopped the fold (type, message, cause, facts)."""
    states: list[Any]
    state, states = RunView().initial(), []
    for event in events:
        try:
            state = apply(state, event)
        except Exception as error:  # compared, not hidden: both folds must raise alike
            facts = vars(error).copy()
            return states, (type(error), str(error), type(error.__cause__), facts)
        states.append(state)
    return states, None


def foreign(events: list[Event], seed: int) -> list[Event]:
    """`events` with events of the user's own classes put in at random places."""
    pick = random.Random(seed)
    mixed = list(events)
    for event in pick.sample(events, min(len(events), 6)):
        run_id, version = event.run_id, event.version
        made: Event = (
            ReviewerPinged(run_id=run_id, version=version)
            if pick.random() < 0.5
            else LateCompleted(run_id=run_id, version=version, stage=pick.choice(STAGES), attempt=1)
        )
        mixed.insert(pick.randrange(len(mixed) + 1), made)
    return mixed


def tampered(events: list[Event], seed: int) -> list[Event]:
    """`events` with one `StageStarted` (if any) naming its stage with a list: the handler of
    `RetryCounts` (a part reached through the table, not its `apply`) raises on it."""
    started = [index for index, event in enumerate(events) if type(event) is StageStarted]
    if not started:
        return events
    index = random.Random(seed).choice(started)
    broken = copy.copy(events[index])
    object.__setattr__(broken, "stage", [1])  # past the validators, as a corrupt store would
    return [*events[:index], broken, *events[index + 1 :]]


class TestRunViewDispatch:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(steps=STEPS, seed=st.integers(min_value=0, max_value=2**32))
    def test_each_part_is_as_main_folded_it_after_every_event(
        self, steps: list[tuple[str, str, int]], seed: int
    ) -> None:
        """Per run, across runs mixed (handlers raising) and with foreign event classes:
        the states after every event and the error raised are main's, to the letter."""
        with Engine("memory://") as engine:
            review = engine.start_run(REVIEW)
            runs = {
                "review": review,
                "child": engine.start_run(REVIEW, parent=review),
                "hub": engine.start_run(hub_table(hub=True)),
                "strict": engine.start_run(hub_table(hub=False)),
                "rounds": engine.start_run(TOOL_LOOP),
            }
            for which, action, number in steps:
                step(engine, runs, which, action, number)
            streams = [engine.events(run.id) for run in runs.values()]
        mixed = sorted((e for s in streams for e in s), key=lambda e: (e.timestamp, e.version))
        shuffled = random.Random(seed).sample(mixed, len(mixed))
        cases = [*streams, foreign(streams[0], seed), mixed, foreign(shuffled, seed)]
        for events in [*cases, *(tampered(events, seed) for events in streams)]:
            assert outcome(RunView().apply, events) == outcome(main_apply, events)

    def test_a_handlers_error_is_wrapped_as_main_wrapped_it(self) -> None:
        """A part's handler raising (reached through the table) is a `ProjectionError` naming
        that part, the event and its version, with the same message and cause as before."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            run.stage_started(run.state)
            events = tampered(engine.events(run.id), 0)
        states, error = outcome(RunView().apply, events)
        assert (states, error) == outcome(main_apply, events)
        assert error is not None
        assert (error[0], error[2]) == (ProjectionError, TypeError)
        assert (error[3]["projection"], error[3]["version"]) == ("retry_counts", 2)
