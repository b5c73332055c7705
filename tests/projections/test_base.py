from __future__ import annotations

import importlib
import json
import pickle
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine
from events import NoteAdded, RunStarted, StageCompleted, StageFailed, StateRolledBack
from projections import (
    BUILT_INS,
    Projection,
    ProjectionError,
    ProjectionStateError,
    StateStack,
    as_projection,
    folding,
    handled_topics,
    on,
)
from tests._helpers import REVIEW, FailuresByType
from tests.projections.test_projection_properties import ACTIONS, record

RID = uuid.uuid4()


def failed(version: int, error_type: str = "BuildException") -> StageFailed:
    return StageFailed(
        run_id=RID, version=version, stage="developer", attempt=version, error_type=error_type
    )


class Exploding(Projection[int]):
    def initial(self) -> int:
        return 0

    @on(StageFailed)
    def failed(self, state: int, event: StageFailed) -> int:
        raise ZeroDivisionError("no")


class TestOn:
    def test_marks_a_handler_for_several_types(self) -> None:
        """One method may handle several event types."""

        class Both(Projection[int]):
            def initial(self) -> int:
                return 0

            @on(StageFailed, StageCompleted)
            def outcome(self, state: int, event: Any) -> int:
                return state + 1

        assert set(Both.handlers) == {StageFailed, StageCompleted}

    @pytest.mark.parametrize("bad", [[], [int], ["StageFailed"]])
    def test_refuses_what_is_not_an_event_type(self, bad: list[Any]) -> None:
        """@on without event types, or with non-Event classes, raises TypeError."""
        with pytest.raises(TypeError, match="@on"):
            on(*bad)

    def test_subclass_handler_overrides_its_base(self) -> None:
        """A subclass's handler for a type replaces the base class's."""

        class Doubled(FailuresByType):
            name = "doubled"

            @on(StageFailed)
            def twice(self, state: dict[str, int], event: StageFailed) -> dict[str, int]:
                return {**state, event.error_type: state.get(event.error_type, 0) + 2}

        assert Doubled().fold([failed(1)]) == {"BuildException": 2}


class TestProjection:
    def test_folds_events_through_handlers(self) -> None:
        """fold applies each handled event in order from the initial state."""
        events = [failed(1), failed(2, "Timeout"), failed(3)]
        assert FailuresByType().fold(events) == {"BuildException": 2, "Timeout": 1}

    def test_passes_over_unknown_event_types(self) -> None:
        """Events without a handler leave the state as it is."""
        note = NoteAdded(run_id=RID, version=1, key="k", value=1)
        assert FailuresByType().apply({"x": 1}, note) == {"x": 1}

    def test_fold_continues_from_a_given_state(self) -> None:
        """fold(events, state) starts from `state`, not from initial()."""
        assert FailuresByType().fold([failed(2)], {"BuildException": 1}) == {"BuildException": 2}

    def test_a_raising_handler_names_projection_event_and_version(self) -> None:
        """A handler's exception becomes ProjectionError with the projection, event and version."""
        with pytest.raises(ProjectionError) as caught:
            Exploding().fold([failed(7)])
        error = caught.value
        assert (error.projection, error.event_type, error.version) == (
            "exploding",
            "StageFailed",
            7,
        )
        assert error.run_id == RID
        assert "ZeroDivisionError: no" in str(error)
        assert isinstance(error.__cause__, ZeroDivisionError)

    def test_projection_error_pickles(self) -> None:
        """ProjectionError crosses process boundaries with its facts."""
        with pytest.raises(ProjectionError) as caught:
            Exploding().fold([failed(7)])
        copy = pickle.loads(pickle.dumps(caught.value))
        assert (copy.projection, copy.version, str(copy)) == ("exploding", 7, str(caught.value))

    def test_default_name_is_the_class_name_in_snake_case(self) -> None:
        """Without its own name, a projection (even a subclass) is named after its class."""

        class BuildFailureCounter(FailuresByType):
            pass

        assert BuildFailureCounter.name == "build_failure_counter"

        class TestRunsPerHour(Projection[int]):
            def initial(self) -> int:
                return 0

        assert TestRunsPerHour.name == "test_runs_per_hour"

    @pytest.mark.parametrize(
        ("attribute", "value"), [("scope", "per_stage"), ("version", 0), ("version", "2")]
    )
    def test_bad_class_attributes_are_refused(self, attribute: str, value: object) -> None:
        """An unknown scope or a version that is not an int >= 1 fails at class definition."""
        with pytest.raises(TypeError, match=attribute):
            type("Bad", (Projection,), {attribute: value, "initial": lambda self: 0})

    def test_json_state_round_trips_by_default(self) -> None:
        """A JSON state needs no codec: encode gives JSON, decode gives it back."""
        projection = FailuresByType()
        state = projection.fold([failed(1)])
        assert projection.decode(json.loads(json.dumps(projection.encode(state)))) == state

    def test_a_state_that_is_not_json_asks_for_a_codec(self) -> None:
        """Encoding a non-JSON state without encode/decode names the projection and the fix."""

        class Sets(Projection[set[str]]):
            def initial(self) -> set[str]:
                return set()

        with pytest.raises(ProjectionStateError, match=r"'sets'.*define encode\(\) and decode"):
            Sets().encode({"a"})

    def test_fingerprint_changes_with_the_code_and_the_version(self) -> None:
        """The fingerprint differs when a handler's code or the version changes."""

        def make(increment: int, version: int) -> type[Projection[int]]:
            body = f"return state + {increment}"
            namespace: dict[str, Any] = {}
            exec(f"def counted(self, state, event):\n    {body}\n", namespace)
            return type(
                "Counter",
                (Projection,),
                {
                    "version": version,
                    "initial": lambda self: 0,
                    "counted": on(StageFailed)(namespace["counted"]),
                },
            )

        same = make(1, 1).fingerprint()
        assert make(1, 1).fingerprint() == same
        assert make(2, 1).fingerprint() != same
        assert make(1, 2).fingerprint() != same

    def test_as_projection_takes_classes_and_instances(self) -> None:
        """as_projection instantiates classes, keeps instances and refuses anything else."""
        instance = FailuresByType()
        assert as_projection(instance) is instance
        assert isinstance(as_projection(FailuresByType), FailuresByType)
        with pytest.raises(TypeError, match="Projection"):
            as_projection(RunStarted)  # type: ignore[arg-type]

    def test_relevant_follows_the_handlers(self) -> None:
        """relevant() is true for handled types only, unless every_event is set."""

        class Everything(FailuresByType):
            every_event: ClassVar[bool] = True

        start = RunStarted(run_id=RID, version=1, pipeline="p", table=REVIEW.to_dict())
        assert FailuresByType().relevant(failed(1))
        assert not FailuresByType().relevant(start)
        assert Everything().relevant(start)


class TestFingerprintCoverage:
    def test_a_handler_wrapped_from_another_file_is_read_from_its_own(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A handler wrapped by a decorator of another file, which has a function of the same
        name on the same line, is fingerprinted from its own source: its edits count."""
        (tmp_path / "wrappers.py").write_text(
            "import functools\n\n\n\n\n\n\n\n\n"
            "def counted(state, event):\n    return 'not the handler'\n\n\n"
            "def wrapping(f):\n    @functools.wraps(f)\n"
            "    def inner(*a, **k):\n        return f(*a, **k)\n    return inner\n"
        )
        source = (
            "from events import NoteAdded\nfrom projections import Projection, on\n"
            "from wrappers import wrapping\n\n\nclass Counts(Projection[int]):\n"
            "    def initial(self):\n        return 0\n\n"
            "    @on(NoteAdded)\n    @wrapping\n    def counted(self, state, event):\n"
            "        return state + {step}\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        prints = []
        for step, module in ((1, "counts_one"), (2, "counts_two")):
            (tmp_path / f"{module}.py").write_text(source.format(step=step))
            prints.append(importlib.import_module(module).Counts.fingerprint())
        assert prints[0] != prints[1]

    def test_scope_and_constants_change_the_fingerprint(self) -> None:
        """Two classes differing only in scope or a class constant get different fingerprints."""

        def make(scope: str, limit: int) -> type[Projection[int]]:
            return type(
                "Count", (FailuresByType,), {"name": "count", "scope": scope, "LIMIT": limit}
            )

        base = make("all", 3).fingerprint()
        assert make("run", 3).fingerprint() != base
        assert make("all", 4).fingerprint() != base

    def test_instance_settings_change_the_identity(self) -> None:
        """Instances built with other arguments have another identity (snapshots, state)."""

        class AtLeast(FailuresByType):
            def __init__(self, minimum: int) -> None:
                self.minimum = minimum

        assert AtLeast(1).identity() == AtLeast(1).identity()
        assert AtLeast(1).identity() != AtLeast(2).identity()
        assert FailuresByType().identity() == FailuresByType.fingerprint()

    def test_overriding_apply_sees_every_event(self) -> None:
        """A class with its own apply gets every_event, so every path folds the same."""

        class Counter(Projection[int]):
            def initial(self) -> int:
                return 0

            def apply(self, state: int, event: Any) -> int:
                return state + 1

        note = NoteAdded(run_id=RID, version=1, key="k", value=1)
        assert Counter.every_event is True
        assert Counter().relevant(note)
        assert Counter().fold([note, note]) == 2


class TestHandledTopics:
    def test_the_topics_of_the_handled_event_types(self) -> None:
        """A projection with handlers only needs its handled events' topics."""
        handled = (RunStarted, StageCompleted, StageFailed, StateRolledBack)
        assert handled_topics(StateStack()) == frozenset(cls.topic for cls in handled)
        assert handled_topics(FailuresByType()) == frozenset([StageFailed.topic])

    def test_none_for_a_projection_that_sees_every_event(self) -> None:
        """A projection with its own `apply`, or `every_event`, may need any event: None."""

        class Counted(Projection[int]):
            def initial(self) -> int:
                return 0

            def apply(self, state: int, event: Any) -> int:
                return state + 1

        class Everything(FailuresByType):
            every_event = True

        assert handled_topics(Counted()) is None
        assert handled_topics(Everything()) is None


class Narrowable:
    """A source of events that can leave some topics out, as a store's stream can."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.asked: list[frozenset[str]] = []

    def __iter__(self) -> Any:
        return iter(self.events)

    def narrowed(self, topics: frozenset[str]) -> list[Any]:
        self.asked.append(frozenset(topics))
        return [event for event in self.events if event.topic in topics]


class TestNarrowedFold:
    def test_a_fold_asks_a_narrowable_source_for_its_handled_topics(self) -> None:
        """`fold` folds what the source's `narrowed(handled_topics)` gives, to the same state."""
        events = [
            NoteAdded(run_id=RID, version=1, key="k", value=1),
            failed(2),
            failed(3, "Other"),
        ]
        source = Narrowable(events)
        assert FailuresByType().fold(source) == FailuresByType().fold(events)
        assert source.asked == [frozenset([StageFailed.topic])]

    def test_a_projection_seeing_every_event_is_not_narrowed(self) -> None:
        """A projection whose `handled_topics` is None folds the source as it is."""

        class Counted(Projection[int]):
            def initial(self) -> int:
                return 0

            def apply(self, state: int, event: Any) -> int:
                return state + 1

        source = Narrowable([failed(1), NoteAdded(run_id=RID, version=2, key="k", value=1)])
        assert Counted().fold(source) == 2
        assert source.asked == []


class TestFolding:
    @pytest.mark.parametrize("projection_class", BUILT_INS)
    @settings(max_examples=25, deadline=None)
    @given(steps=ACTIONS, cuts=st.lists(st.integers(0, 45), max_size=6), ask=st.booleans())
    def test_a_folding_fed_in_parts_holds_the_fold_of_all_so_far(
        self,
        projection_class: type[Projection[Any]],
        steps: list[tuple[str, str, int]],
        cuts: list[int],
        ask: bool,
    ) -> None:
        """Fed a run's events in any parts, asked for its state between parts or not, a
        folding holds the fold of every event fed, from the state it began at."""
        with Engine("memory://") as engine:
            runs, _ = record(engine, steps)
            events = engine.events(runs["parent"].id)
        projection = projection_class()
        bounds = sorted({0, len(events), *(cut for cut in cuts if cut < len(events))})
        fold = folding(projection, projection.fold(events[: bounds[1] // 2]))
        fed = bounds[1] // 2
        for end in bounds[1:]:
            fold.feed(events[fed:end])
            fed = end
            if ask or end == len(events):
                assert fold.state() == projection.fold(events[:end])
