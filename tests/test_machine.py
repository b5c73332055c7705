"""`engine.machine.replay`: the one start-then-apply fold over a run's history."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest

from engine import Engine, InvalidTransition, Pipeline, StagetrailError
from engine.machine import RunState, apply, replay, start
from events import Event, RunStarted, StageCompleted
from tests._helpers import REVIEW


def recorded(engine: Engine) -> list[Event]:
    """A run with outcomes, a rollback, tasks, a note and a failure: each fold rule used."""
    run = engine.start_run(REVIEW, params={"card": "C-1"})
    run.stage_started("project_analysis")
    run.stage_completed("project_analysis", result={"kind": "python"})
    run.stage_completed("code_review")
    run.rollback(1, reason="again")
    run.stage_completed("code_review")
    run.add_task("t1")
    run.task_started("t1")
    run.stage_failed("developer", error="boom")
    run.task_completed("t1", result=1)
    run.note("k", [1, 2])
    return engine.events(run.id)


def folded_by_hand(events: Sequence[Event]) -> tuple[Pipeline, RunState]:
    """The loop the engine, the verifier and the LangGraph thread each wrote before replay."""
    first = events[0]
    assert isinstance(first, RunStarted)
    pipeline = Pipeline.from_dict(first.table)
    state = start(pipeline, first)
    for event in events[1:]:
        state = apply(pipeline, state, event)
    return pipeline, state


class TestReplay:
    def test_equals_the_start_then_apply_loop(self, engine: Engine) -> None:
        """replay gives the same pipeline and state as starting and applying each event."""
        events = recorded(engine)
        first = events[0]
        assert isinstance(first, RunStarted)
        assert replay(first, events[1:]) == folded_by_hand(events)

    def test_every_prefix_equals_the_loop(self, engine: Engine) -> None:
        """At each version the replayed state is the loop's state (time travel of the machine)."""
        events = recorded(engine)
        first = events[0]
        assert isinstance(first, RunStarted)
        for end in range(1, len(events) + 1):
            assert replay(first, events[1:end]) == folded_by_hand(events[:end])

    def test_a_given_pipeline_is_used_as_is(self, engine: Engine) -> None:
        """The caller's pipeline is the one returned (the table is not rebuilt)."""
        events = recorded(engine)
        first = events[0]
        assert isinstance(first, RunStarted)
        pipeline, state = replay(first, events[1:], pipeline=REVIEW)
        assert pipeline is REVIEW
        assert state == folded_by_hand(events)[1]

    def test_the_state_matches_the_live_run(self, engine: Engine) -> None:
        """Replaying a stored run gives the machine its live handle holds."""
        events = recorded(engine)
        first = events[0]
        assert isinstance(first, RunStarted)
        assert replay(first, events[1:])[1] == engine.load(first.run_id).machine

    def test_an_event_breaking_a_rule_raises(self, engine: Engine) -> None:
        """Without `refused`, the first illegal event raises and names the rule."""
        events = recorded(engine)
        first = events[0]
        assert isinstance(first, RunStarted)
        illegal = StageCompleted(
            run_id=first.run_id,
            version=len(events) + 1,
            stage="developer",
            attempt=2,
            outcome="nope",
        )
        with pytest.raises(InvalidTransition, match="'nope'"):
            replay(first, [*events[1:], illegal])

    def test_refused_events_are_reported_and_passed_over(self, engine: Engine) -> None:
        """With `refused`, an illegal event is handed over and the fold goes on after it."""
        events = recorded(engine)
        first = events[0]
        assert isinstance(first, RunStarted)
        bad = len(events) + 1
        illegal = StageCompleted(run_id=first.run_id, version=bad, stage="testing", attempt=1)
        then = StageCompleted(run_id=first.run_id, version=bad + 1, stage="developer", attempt=2)
        seen: list[tuple[int, str]] = []

        def refused(event: Event, error: StagetrailError) -> None:
            seen.append((event.version, type(error).__name__))

        _, state = replay(first, [*events[1:], illegal, then], refused=refused)
        assert seen == [(bad, "InvalidTransition")]
        assert (state.state, state.version) == ("testing", bad + 1)

    def test_a_first_event_that_is_not_version_one_is_refused(self, engine: Engine) -> None:
        """The start rule holds in replay too: RunStarted must be event 1."""
        first = recorded(engine)[0]
        assert isinstance(first, RunStarted)
        with pytest.raises(StagetrailError, match="event 1"):
            replay(attrs.evolve(first, version=2))
