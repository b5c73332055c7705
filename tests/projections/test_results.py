from __future__ import annotations

import json
import random
import uuid
from typing import Any, TypeVar

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import (
    JSON,
    Event,
    ProgressObserved,
    StageCompleted,
    StageFailed,
    StageStarted,
    StateRolledBack,
)
from projections.base import Projection, on
from projections.immutable import ROWS_PER_BLOCK, PList, PMap, RowList
from projections.results import (
    Attempt,
    Results,
    Retries,
    RetryCounts,
    StageResults,
)
from tests._helpers import PausedThread, switching_often
from tests.projections._own_way import applied, assert_folds_as_applied, ignoring, prefixes

RID = uuid.UUID(int=2)
RESULTS = StageResults()
RETRIES = RetryCounts()
S = TypeVar("S")


def start(version: int, stage: str, attempt: int = 1) -> StageStarted:
    return StageStarted(run_id=RID, version=version, stage=stage, attempt=attempt)


def done(version: int, stage: str, result: JSON = None, **fields: Any) -> StageCompleted:
    fields.setdefault("attempt", 1)
    return StageCompleted(run_id=RID, version=version, stage=stage, result=result, **fields)


def fail(version: int, stage: str, error: str = "boom", **fields: Any) -> StageFailed:
    fields.setdefault("attempt", 1)
    return StageFailed(run_id=RID, version=version, stage=stage, error=error, **fields)


def roundtrip(projection: Projection[S], state: S) -> S:
    encoded = json.dumps(projection.encode(state), allow_nan=False)
    return projection.decode(json.loads(encoded))


def results(*events: Event) -> Results:
    return RESULTS.fold(events)


def retries(*events: Event) -> Retries:
    return RETRIES.fold(events)


class TestStageResults:
    def test_empty(self) -> None:
        """A stage without outcomes has no latest result, no attempts and no durations."""
        state = results()
        assert state.latest("developer") is None
        assert state.attempts("developer") == ()
        assert state.durations("developer") == ()

    def test_latest_is_newest_completed(self) -> None:
        """latest() gives the newest completed result, not an older one nor a later failure."""
        state = results(
            done(2, "developer", {"patch": 1}),
            done(3, "developer", {"patch": 2}, attempt=2),
            fail(4, "developer", attempt=3),
        )
        assert state.latest("developer") == {"patch": 2}

    def test_latest_none_when_only_failures(self) -> None:
        """A stage that only failed has no latest result."""
        assert results(fail(2, "testing"), fail(3, "testing", attempt=2)).latest("testing") is None

    def test_attempts_record_outcomes(self) -> None:
        """attempts() lists each outcome oldest first with its result or error."""
        state = results(
            fail(2, "developer", "no", error_type="KeyError", duration=1.0),
            done(3, "developer", {"ok": True}, attempt=2, outcome="shipped", duration=2.5),
        )
        assert state.attempts("developer") == (
            Attempt(1, "failed", True, None, "no", "KeyError", 1.0, 2),
            Attempt(2, "shipped", False, {"ok": True}, None, None, 2.5, 3),
        )

    def test_stages_are_separate(self) -> None:
        """Outcomes of one stage do not appear under another."""
        state = results(done(2, "a", 1), done(3, "b", 2))
        assert [attempt.result for attempt in state.attempts("a")] == [1]
        assert state.latest("b") == 2
        assert state.stages == ("a", "b")

    def test_durations(self) -> None:
        """durations() lists each attempt's duration oldest first."""
        state = results(fail(2, "d", duration=1.5), done(3, "d", attempt=2, duration=0.25))
        assert state.durations("d") == (1.5, 0.25)

    def test_rollback_keeps_history(self) -> None:
        """A rollback does not erase recorded attempts."""
        state = results(done(2, "d", 1), StateRolledBack(run_id=RID, version=3, steps=1))
        assert state.latest("d") == 1
        assert len(state.attempts("d")) == 1

    def test_earlier_state_unchanged(self) -> None:
        """Appending an attempt leaves the earlier state's lists as they were."""
        before = results(done(2, "d", 1))
        after = RESULTS.apply(before, done(3, "d", 2, attempt=2))
        assert len(before.attempts("d")) == 1
        assert len(after.attempts("d")) == 2

    def test_roundtrip(self) -> None:
        """Results survive encode, strict JSON and decode."""
        state = results(
            fail(2, "d", "x", duration=0.1),
            done(3, "d", {"nested": [1, {"k": None}]}, attempt=2, duration=3.3),
            done(4, "t", "text"),
        )
        assert roundtrip(RESULTS, state) == state
        assert roundtrip(RESULTS, results()) == results()

    def test_restored_latest_reads_one_event(self) -> None:
        """After a snapshot, the latest result of a stage that then kept failing reads one event."""
        events: list[Event] = [done(2, "d", "kept"), *(fail(v, "d") for v in range(3, 2000))]
        state = results(*events)
        read: list[tuple[int, int]] = []

        def source(gt: int, lte: int) -> Any:
            read.append((gt, lte))
            return iter([e for e in events if gt < e.version <= lte])

        data = json.loads(json.dumps(RESULTS.snapshot(state)))
        restored = RESULTS.restore(data, source)
        assert read == []
        assert restored.latest("d") == "kept"
        assert read == [(1, 2)]
        assert restored.latest("missing") is None
        assert restored == state

    def test_scope_is_run(self) -> None:
        """Persistent use keeps one state per run."""
        assert StageResults.scope == "run"

    def test_attempts_share_their_outcomes_and_errors(self) -> None:
        """Attempts of equal outcomes and errors (each event its own copy) hold one str each."""
        events = [fail(v, "build", "".join(["bo", "om"]), attempt=v) for v in range(1, 5)]
        attempts = results(*events).attempts("build")
        assert [a.error for a in attempts] == ["boom"] * 4
        assert len({id(part) for a in attempts for part in (a.outcome, a.error, a.error_type)}) == 3


class TestRetryCounts:
    def test_started_attempt_counts_once(self) -> None:
        """StageStarted followed by its outcome is one attempt, not two."""
        state = retries(start(2, "d"), done(3, "d"))
        assert state.attempts("d") == 1
        assert state.total_attempts == 1

    def test_outcome_without_start_counts(self) -> None:
        """An outcome with no StageStarted before it is an attempt of its own."""
        state = retries(done(2, "d"), fail(3, "t"), start(4, "t", 2), done(5, "t", attempt=2))
        assert (state.attempts("d"), state.attempts("t")) == (1, 2)
        assert state.total_attempts == 3

    def test_unknown_stage(self) -> None:
        """A stage never seen has no attempts and no retries."""
        assert (retries().attempts("x"), retries().retries("x")) == (0, 0)

    def test_failure_then_start_is_retry(self) -> None:
        """A failed attempt followed by a start of the same stage is one retry."""
        state = retries(start(2, "d"), fail(3, "d"), start(4, "d", 2))
        assert state.retries("d") == 1
        assert state.attempts("d") == 2

    def test_failure_then_unstarted_outcome_is_retry(self) -> None:
        """A failed attempt followed by an outcome recorded without a start is a retry."""
        state = retries(fail(2, "d"), fail(3, "d", attempt=2), done(4, "d", attempt=3))
        assert state.retries("d") == 2
        assert state.attempts("d") == 3

    def test_last_failure_is_not_retry(self) -> None:
        """A failure not (yet) followed by another attempt is not a retry."""
        state = retries(start(2, "d"), fail(3, "d"))
        assert state.retries("d") == 0

    def test_success_then_attempt_is_not_retry(self) -> None:
        """An attempt after a successful one is not a retry."""
        state = retries(done(2, "d"), start(3, "d", 2), done(4, "d", attempt=2))
        assert state.retries("d") == 0
        assert state.attempts("d") == 2

    def test_retry_after_other_stages(self) -> None:
        """A stage's failure counts as retried when the stage runs again after other stages."""
        state = retries(
            fail(2, "d"), done(3, "t"), fail(4, "t", attempt=2), done(5, "d", attempt=2)
        )
        assert state.retries("d") == 1
        assert state.retries("t") == 0

    def test_other_stage_outcome_while_open(self) -> None:
        """An outcome of another stage while one is started counts as its own attempt."""
        state = retries(start(2, "d"), done(3, "t"), done(4, "d"))
        assert (state.attempts("d"), state.attempts("t")) == (1, 1)

    def test_unrelated_events_ignored(self) -> None:
        """Events that are not stage events leave the counts unchanged."""
        state = retries(start(2, "d"))
        assert RETRIES.apply(state, ProgressObserved(run_id=RID, version=3)) is state

    def test_roundtrip(self) -> None:
        """Counts, including an open attempt and pending failures, survive a JSON round trip."""
        state = retries(fail(2, "d"), fail(3, "t"), start(4, "d", 2), fail(5, "d", attempt=2))
        state = RETRIES.apply(state, start(6, "t", 2))
        assert state.open_stage == "t"
        assert roundtrip(RETRIES, state) == state
        assert roundtrip(RETRIES, retries()) == retries()


RETRY_STEP = st.tuples(
    st.sampled_from(["start", "done", "done", "fail", "fail", "verdict", "note", "many"]),
    st.sampled_from(["build", "test", "lint"]),
)
"""One step of a history `RetryCounts` folds in stretches: a start (cutting a stretch), an
outcome, a routed verdict (attempt 0), an event no handler takes, or 70 outcomes of a loop."""


def retry_history(steps: list[tuple[str, str]]) -> list[Event]:
    """The events of `steps`, versions from 2 (a `many` step: outcomes, one in 7 failed)."""
    events: list[Event] = []
    for kind, stage in steps:
        for index in range(70 if kind == "many" else 1):
            version = len(events) + 2
            if kind == "start":
                events.append(start(version, stage))
            elif kind == "fail" or (kind == "many" and index % 7 == 6):
                events.append(fail(version, stage))
            elif kind == "note":
                events.append(ProgressObserved(run_id=RID, version=version))
            else:
                events.append(done(version, stage, attempt=0 if kind == "verdict" else 1))
    return events


@attrs.frozen(weakref_slot=False)
class KeptRetries(Retries):
    """A subclass of the counters, kept by `Retries.end` closing a started attempt."""


class TestRetryCountsFold:
    @settings(max_examples=150, deadline=None)
    @given(st.lists(RETRY_STEP, max_size=30), st.data())
    def test_a_fold_from_any_state_gives_what_apply_gives(
        self, steps: list[tuple[str, str]], data: st.DataObject
    ) -> None:
        """From any state `apply` reached (or its JSON round trip), a fold of any stretch of
        the events after it (a list or an iterator) gives the counters `apply` gives event by
        event, and leaves the state it went on from as it was."""
        events = retry_history(steps)
        states = prefixes(RETRIES, events)
        begin = data.draw(st.integers(0, len(events)), "begin")
        end = data.draw(st.integers(begin, len(events)), "end")
        before = RETRIES.encode(states[begin])
        for origin in (states[begin], roundtrip(RETRIES, states[begin])):
            for given_events in (events[begin:end], iter(events[begin:end])):
                folded = RETRIES.fold(given_events, origin)
                assert folded == states[end]
                assert RETRIES.encode(folded) == RETRIES.encode(states[end])
        assert RETRIES.encode(states[begin]) == before
        if end < len(events):  # the counters a fold made go on as `apply`'s do
            made = RETRIES.fold(events[begin:end], states[begin])
            assert RETRIES.fold(events[end:], made) == states[-1]

    def test_a_subclass_taking_outcomes_its_own_way_folds_them_its_way(self) -> None:
        """A subclass whose own handler (or `apply`) takes outcomes folds them with it, as
        `apply` event by event does, not with the counters' stretches."""
        events = retry_history([("many", "build")] * 4)
        for projection in ignoring(RetryCounts, StageFailed):
            assert projection.fold(events) == applied(projection, events)
            assert projection.fold(iter(events)).attempts("build") == 240

    @pytest.mark.parametrize(
        ("start_state", "outcome"),
        [
            (KeptRetries(), done(2, "build", attempt=0)),
            (KeptRetries(open_stage="build"), done(2, "build")),
            (KeptRetries(open_stage="build"), fail(2, "build")),
            (Retries(attempt_counts=PMap({"build": 1}), open_stage="build"), done(2, "build")),
            (Retries(retry_counts=PMap({"build": 1}), open_stage="build"), fail(2, "build")),
        ],
    )
    def test_a_fold_from_a_state_apply_keeps_as_it_is_gives_what_apply_gives(
        self, start_state: Retries, outcome: Event
    ) -> None:
        """From a state whose counters `apply` keeps as they are (a subclass of `Retries`, a
        mapping other than a dict), a fold gives the very state `apply` gives, its class too."""
        assert_folds_as_applied(RETRIES, start_state, outcome)


class TestFoldInPlace:
    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["done", "fail", "verdict", "many"]),
                st.sampled_from(["build", "test"]),
                st.integers(0, 3),
            ),
            max_size=20,
        ),
        st.integers(0, 20),
    )
    def test_a_fold_is_its_events_applied_one_at_a_time(
        self, ops: list[tuple[str, str, int]], cut: int
    ) -> None:
        """`fold` (outcomes pushed as rows in place, across blocks and stages) gives the
        results, latest results, encoding and snapshot that `apply` gives event by event,
        from the start or from decoded results, and leaves those it went on from as they were."""
        events: list[Event] = [start(1, "build")]
        for kind, stage, number in ops:
            for _ in range(150 if kind == "many" else 1):
                version = len(events) + 1
                if kind == "fail" or version % 7 == 0:
                    events.append(fail(version, stage, f"e{number}", attempt=number + 1))
                else:
                    attempt = 0 if kind == "verdict" else number + 1
                    events.append(done(version, stage, {"v": version}, attempt=attempt))
        applied = RESULTS.initial()
        for event in events:
            applied = RESULTS.apply(applied, event)
        folded = RESULTS.fold(events)
        assert folded == applied
        assert [folded.latest(s) for s in ("build", "test")] == [
            applied.latest(s) for s in ("build", "test")
        ]
        assert RESULTS.encode(folded) == RESULTS.encode(applied)
        assert RESULTS.snapshot(folded) == RESULTS.snapshot(applied)
        begun = RESULTS.fold(events[: cut + 1])
        before = RESULTS.encode(begun)
        for start_from in (begun, roundtrip(RESULTS, begun)):
            went_on = RESULTS.fold(events[cut + 1 :], start_from)
            assert went_on == applied
            assert went_on.latest("test") == applied.latest("test")
            assert RESULTS.snapshot(went_on) == RESULTS.snapshot(applied)
        assert RESULTS.encode(begun) == before


def attempt_versions(state: Results, stage: str) -> list[int]:
    """The versions of `stage`'s attempts, oldest first, as a walk of them reads them."""
    attempts = state.attempts(stage)
    assert len(attempts) == len(state.by_stage.get(stage, ()))
    return [attempt.version for attempt in attempts]


class TestResultsEquality:
    def test_results_whose_latest_results_differ_are_not_equal(self) -> None:
        """Results with the same attempts but another newest completed attempt kept for a
        stage (one built without it) answer `latest` differently, so they are not equal."""
        folded = results(done(2, "build", "first"), fail(3, "build"))
        built = Results(folded.by_stage)
        assert (folded.latest("build"), built.latest("build")) == ("first", None)
        assert folded != built
        newest: PList[Attempt] = PList.of([folded.attempts("build")[0]])
        assert folded == Results(folded.by_stage, {"build": newest})

    def test_results_made_by_hand_with_no_lists_compare_without_error(self) -> None:
        """A `completed` that is not a map of attempt lists is compared as it is, not read."""
        assert Results({}, None) == Results({}, None)  # type: ignore[arg-type]
        assert Results({}, {"build": 1}) != Results({}, {"build": 2})  # type: ignore[dict-item]


class TestFoldedItsOwnWay:
    def test_a_subclass_handling_outcomes_its_own_way_folds_them_its_way(self) -> None:
        """A subclass whose own handler (or `apply`) takes outcomes folds them with it, as
        `apply` event by event does, not with the results' in-place push."""
        events = [done(v, "build", v) if v % 3 else fail(v, "build") for v in range(2, 300)]
        for projection in ignoring(StageResults, StageFailed):
            assert projection.fold(events) == applied(projection, events)
            assert len(projection.fold(iter(events)).attempts("build")) == 199

    def test_a_subclass_pushing_attempts_made_by_hand_keeps_their_results_as_made(
        self,
    ) -> None:
        """A subclass that pushes an attempt of its own making onto a stage's attempts (here
        holding bytes to be filled in, a bytearray) reads it back as made, its type and
        object kept, after blocks of outcomes sealed above it."""

        class Drafts(StageResults):
            """Results that note a draft buffer beside each failed attempt."""

            @on(StageFailed)
            def failed(self, state: Results, event: StageFailed) -> Results:
                """The failure, then a draft attempt holding a buffer."""
                state = super().failed(state, event)
                attempts = state.by_stage[event.stage].push(
                    Attempt(0, "draft", False, bytearray(b"todo"), None, None, 0.0, event.version)
                )
                return Results({**state.by_stage, event.stage: attempts}, state.completed)

        events = [
            fail(v, "build") if v == 5 else done(v, "build", {"n": v})
            for v in range(2, 3 * ROWS_PER_BLOCK)
        ]
        for state in (Drafts().fold(events), applied(Drafts(), events)):
            draft = [a for a in state.attempts("build") if a.outcome == "draft"]
            assert [type(a.result) for a in draft] == [bytearray]
            assert state == state


class TestThreadedPushes:
    @pytest.mark.parametrize("late", ["apply", "fold"])
    @pytest.mark.parametrize("meanwhile", ["apply", "fold"])
    def test_a_push_held_up_before_its_append_never_changes_a_sealed_block(
        self, late: str, meanwhile: str
    ) -> None:
        """A push from shared results held up between taking a stage's newest block and
        appending to it, while another thread's pushes from the same results fill and seal
        that block, leaves each of the three results with exactly their own attempts."""
        shared = results(*[done(v, "build", v) for v in range(2, 12)])
        late_event = done(5000, "build", 5000)
        more = [done(v, "build", v) for v in range(12, 12 + ROWS_PER_BLOCK + 5)]
        if late == "apply":
            paused = PausedThread(
                RowList.push_row, "tip.extend(row)", lambda: RESULTS.apply(shared, late_event)
            )
        else:
            paused = PausedThread(
                StageResults._pushed_in_place,
                "tip.extend(row)",
                lambda: RESULTS.fold([late_event], shared),
            )
        paused.start()
        went_on = shared
        if meanwhile == "apply":
            for event in more:
                went_on = RESULTS.apply(went_on, event)
        else:
            went_on = RESULTS.fold(more, shared)
        late_state = paused.finish()
        assert attempt_versions(shared, "build") == list(range(2, 12))
        assert attempt_versions(late_state, "build") == [*range(2, 12), 5000]
        assert attempt_versions(went_on, "build") == list(range(2, 12 + len(more)))
        assert [shared.latest("build"), late_state.latest("build")] == [11, 5000]
        assert went_on.latest("build") == 11 + len(more)

    def test_many_threads_going_on_from_shared_results_each_get_their_own_attempts(
        self,
    ) -> None:
        """Threads appending outcomes of two stages (by `apply`, a listed fold and a streamed
        one) to results any thread made before, switching every microsecond, each get the
        attempts and latest results a list given the same steps holds, and no results
        change after they were made."""
        stages = ("build", "test")
        shared = results(*[done(v, "build", v) for v in range(2, 100)])
        made: list[tuple[Results, dict[str, list[int]], dict[str, int | None]]] = [
            (shared, {"build": list(range(2, 100)), "test": []}, {"build": 99, "test": None})
        ]
        failures: list[BaseException] = []

        def seen(state: Results) -> tuple[dict[str, list[int]], dict[str, int | None]]:
            return (
                {stage: attempt_versions(state, stage) for stage in stages},
                {stage: state.latest(stage) for stage in stages},
            )

        def work(seed: int) -> None:
            chance = random.Random(seed)
            try:
                for turn in range(12):
                    state, expected, latest = made[chance.randrange(len(made))]
                    expected, latest = {k: list(v) for k, v in expected.items()}, dict(latest)
                    events: list[Event] = []
                    for at in range(chance.randrange(1, 2 * ROWS_PER_BLOCK)):
                        version = seed * 1_000_000 + turn * 1_000 + at
                        stage = stages[chance.random() < 0.1]
                        if chance.random() < 0.2:
                            events.append(fail(version, stage))
                        else:
                            events.append(done(version, stage, version))
                            latest[stage] = version
                        expected[stage].append(version)
                    how = chance.choice(["apply", "fold", "stream"])
                    if how == "apply":
                        for event in events:
                            state = RESULTS.apply(state, event)
                    else:
                        state = RESULTS.fold(events if how == "fold" else iter(events), state)
                    assert seen(state) == (expected, latest)
                    made.append((state, expected, latest))
            except BaseException as failure:  # handed to the test's thread
                failures.append(failure)

        switching_often(work, range(1, 9))
        assert failures == []
        assert len(made) == 1 + 8 * 12
        for state, expected, latest in made:
            assert seen(state) == (expected, latest)
