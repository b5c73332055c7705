"""`engine.machine.replay`: the one start-then-apply fold over a run's history."""

from __future__ import annotations

import inspect
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest

from engine import Engine, InvalidTransition, Pipeline, StagetrailError, machine
from engine.errors import AttemptError, RuleViolation, RunAlreadyFinished
from engine.machine import MachineFold, RunState, apply, replay, start
from events import (
    DECIDED,
    EVENT_TYPES,
    CheckpointSaved,
    Event,
    NoteAdded,
    RetryScheduled,
    RunFinished,
    RunStarted,
    StageCompleted,
    StageFailed,
    StageStarted,
    StateRolledBack,
)
from projections.immutable import PList, PMap
from tests._helpers import REVIEW, hub_history, hub_table


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


def machine_view(state: RunState) -> tuple[object, ...]:
    """What a run's machine says apart from versions and times: state, stack, attempts."""
    return (state.state, state.stack.to_tuple(), dict(state.attempts), state.open_attempt)


class TestImplicitRoute:
    def test_an_implicit_route_moves_the_machine_as_a_recorded_one(self, engine: Engine) -> None:
        """Outcomes taking the hub's route implicitly leave the machine a recorded route leaves."""
        explicit = hub_history(engine, explicit=True)
        implicit = hub_history(engine, explicit=False)
        assert machine_view(implicit.machine) == machine_view(explicit.machine)
        assert implicit.machine.state == "hub"
        assert implicit.machine.stack.to_tuple() == (
            *("hub", "a", "hub", "b", "hub", "b", "b_done"),
        )
        assert dict(implicit.machine.attempts) == {"a": 1, "b": 2, "b_done": 1}  # hub: none
        assert (implicit.version, explicit.version) == (5, 8)  # three routes fewer

    @pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "implicit"])
    def test_load_replay_verify_and_fork_agree(self, engine: Engine, explicit: bool) -> None:
        """A run with routes of either kind loads, replays, verifies and forks to one state."""
        run = hub_history(engine, explicit=explicit)
        events = engine.events(run.id)
        first = events[0]
        assert isinstance(first, RunStarted)
        assert replay(first, events[1:])[1] == run.machine == engine.load(run.id).machine
        assert engine.verify(run.id).ok
        fork = engine.fork(run.id, at=run.version)
        assert machine_view(fork.machine) == machine_view(run.machine)
        fork.stage_completed("a", outcome="failed")  # the fork goes on from the hub
        assert fork.state == "hub"

    @pytest.mark.parametrize("steps", [1, 2, 3])
    def test_a_rollback_counts_the_implicit_route_as_a_step(
        self, engine: Engine, steps: int
    ) -> None:
        """Rolling back k steps lands where it lands after a recorded route: the route is a step."""
        landed = []
        for explicit in (True, False):
            run = hub_history(engine, explicit=explicit)
            run.rollback(steps)
            landed.append(machine_view(run.machine))
        assert landed[0] == landed[1]
        assert landed[1][0] == {1: "b_done", 2: "b", 3: "hub"}[steps]

    def test_a_table_without_a_hub_still_wants_the_route(self, engine: Engine) -> None:
        """Without a declared hub, an outcome not naming the run's state is refused, unwritten."""
        run = engine.start_run(hub_table(hub=False))
        with pytest.raises(InvalidTransition) as refused:
            run.stage_completed("a")
        assert (refused.value.state, refused.value.stage) == ("hub", "a")
        assert len(engine.events(run.id)) == 1
        assert hub_history(engine, explicit=True, hub=False).state == "hub"  # routes recorded

    def test_only_a_stage_the_hub_routes_to_takes_the_route(self, engine: Engine) -> None:
        """An outcome of a stage with no row (hub, stage, stage) is refused in the hub."""
        run = engine.start_run(hub_table(hub=True))
        with pytest.raises(InvalidTransition):
            run.stage_completed("b_done")
        run.stage_completed("b")
        with pytest.raises(InvalidTransition):  # in b_done, not the hub: no route to a
            run.stage_completed("a")

    def test_an_outcome_the_routed_stage_lacks_is_refused(self, engine: Engine) -> None:
        """The route is taken only with the outcome: a bad outcome of the stage moves nothing."""
        run = engine.start_run(hub_table(hub=True))
        with pytest.raises(InvalidTransition, match="'odd'"):
            run.stage_completed("a", outcome="odd")
        assert (run.state, run.version) == ("hub", 1)

    @pytest.mark.parametrize("explicit", [True, False])
    def test_the_route_is_refused_while_an_attempt_of_the_hub_is_open(
        self, engine: Engine, explicit: bool
    ) -> None:
        """With the hub's attempt open, a route from it, recorded or implicit, is refused."""
        run = engine.start_run(hub_table(hub=True))
        run.stage_started("hub")
        with pytest.raises(AttemptError, match="attempt 1 of 'hub' is open"):
            if explicit:
                run.record(StageCompleted, stage="hub", attempt=DECIDED, outcome="a")
            else:
                run.stage_completed("a")
        assert (run.state, run.version) == ("hub", 2)

    def test_a_wrong_attempt_number_through_the_route_is_refused(self, engine: Engine) -> None:
        """An outcome taking the route carries the attempt it would after a recorded route."""
        run = engine.start_run(hub_table(hub=True))
        run.stage_completed("a")
        with pytest.raises(AttemptError, match="attempt 1 should be 2"):
            run.record(StageCompleted, stage="a", attempt=1, outcome="completed")
        run.record(StageCompleted, stage="a", attempt=2, outcome="completed")
        assert (run.state, dict(run.machine.attempts)) == ("hub", {"a": 2})

    def test_a_decided_outcome_can_take_the_route(self, engine: Engine) -> None:
        """A decided outcome of a routed stage moves through the stage and counts no attempt."""
        run = engine.start_run(hub_table(hub=True))
        run.record(StageCompleted, stage="a", attempt=DECIDED, outcome="completed")
        assert run.state == "hub"
        assert run.machine.stack.to_tuple() == ("hub", "a")
        assert dict(run.machine.attempts) == {}


class TestMachineFoldIdentity:
    def test_a_change_to_the_table_semantics_gives_a_new_identity(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Machine snapshots are stale once `events.table` (a hub's implicit route) changes."""
        fold = MachineFold()
        before = fold.identity()
        table_module, source = sys.modules["events.table"], inspect.getsource

        def changed(thing: object) -> str:
            text = source(thing)  # type: ignore[arg-type]
            return text + "\n# a rule changed\n" if thing is table_module else text

        monkeypatch.setattr(inspect, "getsource", changed)
        machine._rules_identity.cache_clear()
        try:
            after = fold.identity()
        finally:
            machine._rules_identity.cache_clear()
        assert after != before


# Main's rule for an outcome recorded before the hub's implicit route was built as one state
# (commit 9c27b40): the route applied as a decided outcome of the hub, then the outcome applied
# to that state. Kept verbatim as the reference `apply` must equal, state for state and error
# for error, on every table (`TestEqualsTheTwoStepRoute`).
def two_step_apply(pipeline: Pipeline, state: RunState, event: Event) -> RunState:
    """`apply` with main's outcome rule (the route built as a state of its own)."""
    if not isinstance(event, StageCompleted | StageFailed):
        return apply(pipeline, state, event)
    if state.status is not None:
        raise RunAlreadyFinished(state.run_id, state.status)
    if event.version != state.version + 1:
        raise RuleViolation(
            state.run_id,
            "version",
            f"event version {event.version} does not follow version {state.version}",
        )
    return two_step_outcome(pipeline, state, event)


def two_step_outcome(
    pipeline: Pipeline, state: RunState, event: StageCompleted | StageFailed
) -> RunState:
    """Main's `_outcome`."""
    dest = pipeline.next_state(state.state, event.outcome)
    if event.stage != state.state or dest is None:
        if not pipeline.routes_implicitly(state.state, event.stage):
            raise InvalidTransition(
                state.state, event.outcome, pipeline.allowed(state.state), event.stage
            )
        routed = two_step_decided(state, event, state.state, event.stage)
        return two_step_outcome(pipeline, routed, event)
    if event.attempt == DECIDED and type(event) is StageCompleted:
        return two_step_decided(state, event, event.stage, dest)
    expected = state.next_attempt(event.stage)
    if event.attempt != expected:
        raise AttemptError(
            state.run_id,
            event.stage,
            f"stage {event.stage!r} attempt {event.attempt} should be {expected}",
        )
    return attrs.evolve(
        state,
        state=dest,
        version=event.version,
        last_timestamp=event.timestamp,
        stack=state.stack.push(state.state),
        attempts={**state.attempts, event.stage: event.attempt},
        open_attempt=None,
        opened_at=None,
    )


def two_step_decided(state: RunState, event: Event, stage: str, dest: str) -> RunState:
    """Main's `_decided`."""
    if state.open_attempt is not None:
        raise AttemptError(
            state.run_id,
            stage,
            f"attempt {state.open_attempt} of {stage!r} is open; a decided outcome "
            "(attempt 0) is recorded between attempts",
        )
    return attrs.evolve(
        state,
        state=dest,
        version=event.version,
        last_timestamp=event.timestamp,
        stack=state.stack.push(state.state),
    )


SPOKES = Pipeline(
    "spokes",
    initial="start",
    transitions=[
        ("start", "go", "h"),
        ("h", "a", "a"),
        ("h", "b", "b"),
        ("h", "c", "b"),  # named for no stage of its own: no implicit route
        ("h", "stop", "end"),
        ("a", "completed", "h"),
        ("a", "again", "a"),
        ("a", "h", "h"),
        ("a", "failed", "start"),
        ("b", "completed", "end"),
        ("b", "failed", "h"),
    ],
    final=["end"],
    hub="h",
)
"""A hub that is not the initial state, a row named for no stage, a stage routing to itself
and an outcome named as the hub."""

TABLES = {
    "hub": hub_table(hub=True),
    "no hub": hub_table(hub=False),
    "spokes": SPOKES,
    "review": REVIEW,
}


def every_event(pipeline: Pipeline, state: RunState) -> Iterator[Event]:
    """Each event that could be recorded next, legal or not: every stage (and one unknown)
    started, completed or failed with every outcome and attempts 0-3, rollbacks, a finish."""
    stages = [*pipeline.states, "nowhere"]
    outcomes = sorted({row[1] for row in pipeline.rows} | set(stages))
    at: dict[str, Any] = {
        "run_id": state.run_id,
        "version": state.version + 1,
        "timestamp": state.last_timestamp,
    }
    for stage in stages:
        for attempt in range(1, 4):
            yield StageStarted(**at, stage=stage, attempt=attempt)
        for outcome in outcomes:
            yield StageCompleted(**at, stage=stage, attempt=0, outcome=outcome)
            for attempt in range(1, 4):
                yield StageCompleted(**at, stage=stage, attempt=attempt, outcome=outcome)
                yield StageFailed(**at, stage=stage, attempt=attempt, outcome=outcome)
    for steps in (1, 2, 3):
        yield StateRolledBack(**at, steps=steps)
    yield RunFinished(**at, status="succeeded")
    yield StageCompleted(**{**at, "version": state.version + 2}, stage=state.state, attempt=1)


def folded(
    fold: Callable[[Pipeline, RunState, Event], RunState],
    pipeline: Pipeline,
    state: RunState,
    event: Event,
) -> RunState | tuple[type, str, dict[str, object]]:
    """The state `fold` gives, or the error it raises as its type, message and facts."""
    try:
        return fold(pipeline, state, event)
    except StagetrailError as error:
        return type(error), str(error), dict(vars(error))


def machine_key(state: RunState) -> tuple[object, ...]:
    """A state less its version and time: states equal here have equal futures."""
    return (
        state.state,
        state.stack.to_tuple(),
        tuple(sorted(state.attempts.items())),
        state.open_attempt,
        state.status,
    )


class TestEqualsTheTwoStepRoute:
    @pytest.mark.parametrize("name", list(TABLES))
    def test_every_reachable_state_and_event(self, name: str) -> None:
        """From every state reachable in three events, every next event, legal or not, gives
        the state, or the error with the same type, message and facts, as main's rule."""
        pipeline = TABLES[name]
        first = RunStarted(
            run_id=uuid.uuid4(), version=1, pipeline=pipeline.name, table=pipeline.to_dict()
        )
        frontier = [start(pipeline, first)]
        seen = {machine_key(frontier[0])}
        compared = routed = 0
        for _ in range(3):
            reached = []
            for state in frontier:
                for event in every_event(pipeline, state):
                    new = folded(apply, pipeline, state, event)
                    assert new == folded(two_step_apply, pipeline, state, event), event
                    compared += 1
                    if isinstance(new, RunState):
                        routed += new.depth == state.depth + 2
                        if machine_key(new) not in seen:
                            seen.add(machine_key(new))
                            reached.append(new)
            frontier = reached
        assert compared > 10_000
        assert (routed > 0) == (pipeline.hub is not None)


class TestUnchangedStamp:
    def test_an_event_the_rules_leave_be_stamps_the_state_as_evolve_would(self) -> None:
        """A note, a checkpoint, a retry's decision or a user's own kind gives the state
        `attrs.evolve` gives with its version and time: every field (each set off its
        default here) the same object, the same type."""
        when = datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)
        state = RunState(
            run_id=uuid.uuid4(),
            pipeline="review",
            state="developer",
            version=7,
            last_timestamp=when,
            stack=PList[str]().push("project_analysis").push("code_review"),
            attempts={"developer": 2},
            open_attempt=3,
            opened_at=when,
            tasks=PMap({"t1": "active"}),
            status=None,
        )
        pipeline = REVIEW
        later: dict[str, Any] = {
            "run_id": state.run_id,
            "version": 8,
            "timestamp": datetime(2027, 1, 1, tzinfo=UTC),
        }

        @attrs.frozen(kw_only=True)
        class Audited(Event):
            topic = "user:Audited"
            grade: int = 0

        try:
            for event in (
                NoteAdded(**later, key="k", value=[1]),
                RetryScheduled(**later, stage="developer", delay=1.0, attempt=3),
                CheckpointSaved(**later, checkpoint_id="c", checkpoint={}, metadata={}),
                Audited(**later),
            ):
                stamped = apply(pipeline, state, event)
                expected = attrs.evolve(state, version=8, last_timestamp=event.timestamp)
                assert type(stamped) is RunState
                assert stamped == expected
                for field in attrs.fields(RunState):
                    assert getattr(stamped, field.name) is getattr(expected, field.name), field
        finally:
            del EVENT_TYPES[Audited.topic]
