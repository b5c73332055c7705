from __future__ import annotations

import json
import pickle
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine, Pipeline
from events import JSON, Event, NoteAdded, StageCompleted, StageFailed, StateRolledBack
from projections import Round, Rounds, RoundsTable, StateStack
from projections.rounds import Rollback
from tests._helpers import hub_history, switching_often
from tests.projections._own_way import applied, ignoring, prefixes

RID = uuid.UUID(int=7)
PROJECTION = RoundsTable()
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

TOOL_LOOP = Pipeline(
    "tool-loop",
    initial="round",
    transitions=[
        ("round", "tool_call", "round"),
        ("round", "failed", "round"),
        ("round", "answered", "done"),
    ],
    final=["done"],
)


def at(version: int) -> datetime:
    return T0 + timedelta(seconds=version)


def done(version: int, stage: str, result: JSON = None, **fields: Any) -> StageCompleted:
    fields.setdefault("attempt", 1)
    return StageCompleted(
        run_id=RID, version=version, timestamp=at(version), stage=stage, result=result, **fields
    )


def fail(version: int, stage: str, error: str = "boom", **fields: Any) -> StageFailed:
    fields.setdefault("error_type", "ToolError")
    fields.setdefault("attempt", 1)
    return StageFailed(
        run_id=RID, version=version, timestamp=at(version), stage=stage, error=error, **fields
    )


def back(version: int, steps: int, reason: str = "") -> StateRolledBack:
    return StateRolledBack(
        run_id=RID, version=version, timestamp=at(version), steps=steps, reason=reason
    )


def fold(*events: Event) -> Rounds:
    return PROJECTION.fold(events)


def roundtrip(state: Rounds) -> Rounds:
    return PROJECTION.decode(json.loads(json.dumps(PROJECTION.encode(state), allow_nan=False)))


LOOP = (
    done(2, "query", {"tools": ["search"]}, outcome="tool_call"),
    done(3, "tool_round", {"hits": 2}, outcome="tool_call"),
    fail(4, "tool_round", "HTTP 503", attempt=2),
    done(5, "tool_round", {"hits": 5}, outcome="tool_call", attempt=3),
)


class TestRoundsTable:
    def test_identity(self) -> None:
        """The built-in is named rounds_table and keeps one state per run."""
        assert (RoundsTable.name, RoundsTable.scope) == ("rounds_table", "run")

    def test_empty(self) -> None:
        """Before any outcome there are no rounds and no latest round."""
        state = fold()
        assert len(state) == 0
        assert state.rounds == state.live == state.rolled_back == ()
        assert state.latest("query") is None

    def test_rounds_in_order_with_their_fields(self) -> None:
        """Each outcome is a round numbered in recording order, with its result or error."""
        state = fold(*LOOP)
        assert len(state) == 4
        assert [r.number for r in state.rounds] == [1, 2, 3, 4]
        assert [r.version for r in state.rounds] == [2, 3, 4, 5]
        first, _, failed, last = state.rounds
        assert first == Round(
            number=1,
            stage="query",
            attempt=1,
            outcome="tool_call",
            result={"tools": ["search"]},
            error=None,
            error_type=None,
            version=2,
            timestamp=at(2),
        )
        assert (failed.outcome, failed.error, failed.error_type) == (
            "failed",
            "HTTP 503",
            "ToolError",
        )
        assert failed.result is None
        assert failed.failed
        assert not first.failed
        assert (last.attempt, last.result) == (3, {"hits": 5})
        assert state.live == state.rounds
        assert state.rolled_back == ()

    def test_rollback_marks_the_newest_live_rounds(self) -> None:
        """A rollback of 2 marks the 2 newest rounds with its version and reason, out of live."""
        state = fold(*LOOP, back(6, 2, "round 2 read a stale index"))
        mark = Rollback(version=6, reason="round 2 read a stale index")
        assert len(state) == 4
        assert [r.rolled_back for r in state.rounds] == [None, None, mark, mark]
        assert [r.number for r in state.rolled_back] == [3, 4]
        assert [r.number for r in state.live] == [1, 2]

    def test_a_second_rollback_skips_rolled_back_rounds(self) -> None:
        """A later rollback marks the newest rounds still live, not those already rolled back."""
        state = fold(
            *LOOP,
            back(6, 2, "stale"),
            done(7, "tool_round", {"hits": 4}, outcome="tool_call", attempt=4),
            back(8, 2, "wrong question"),
        )
        marks = [r.rolled_back for r in state.rounds]
        first, second = Rollback(6, "stale"), Rollback(8, "wrong question")
        assert marks == [None, second, first, first, second]
        assert [r.number for r in state.live] == [1]
        assert [r.version for r in state.live] == [2]

    def test_rollback_deeper_than_the_live_rounds_marks_them_all(self) -> None:
        """A rollback of more steps than live rounds marks every live round and no other."""
        state = fold(*LOOP, back(6, 1), back(7, 10))
        assert state.live == ()
        assert len(state.rolled_back) == 4
        assert [r.rolled_back.version for r in state.rounds if r.rolled_back] == [7, 7, 7, 6]

    def test_latest_ignores_rolled_back_rounds(self) -> None:
        """latest(stage) is the newest round of the stage that no rollback undid."""
        state = fold(*LOOP)
        assert state.latest("tool_round").number == 4  # type: ignore[union-attr]
        state = fold(*LOOP, back(6, 1))
        assert state.latest("tool_round").number == 3  # type: ignore[union-attr]
        state = fold(*LOOP, back(6, 3))
        assert state.latest("tool_round") is None
        assert state.latest("query").number == 1  # type: ignore[union-attr]
        assert state.latest("synthesis") is None

    def test_live_versions_match_the_state_stack(self) -> None:
        """The live rounds are the outcomes the state stack still holds."""
        events = (*LOOP, back(6, 2), done(7, "tool_round", attempt=4), back(8, 1))
        stack = StateStack().fold(events)
        assert [r.version for r in fold(*events).live] == [f.version for f in stack.frames]

    def test_folding_leaves_earlier_states_unchanged(self) -> None:
        """A state handed out stays as it was after later events are folded."""
        before = fold(*LOOP)
        after = PROJECTION.apply(before, back(6, 2))
        assert before.rolled_back == ()
        assert len(after.rolled_back) == 2

    def test_encode_decode_roundtrip_through_strict_json(self) -> None:
        """encode → strict JSON → decode gives back an equal state, indexes included."""
        state = fold(
            *LOOP,
            back(6, 2, "stale"),
            done(7, "tool_round", {"hits": 4}, outcome="tool_call", attempt=4),
        )
        again = roundtrip(state)
        assert again == state
        assert dict(again.live_by_stage) == dict(state.live_by_stage)
        assert again.latest("tool_round") == state.latest("tool_round")
        assert roundtrip(fold()) == fold()

    def test_a_real_run_on_every_backend(self, engine: Engine) -> None:
        """On each store, the rounds of a recorded run, at any version and persistently."""
        run = engine.start_run(TOOL_LOOP)
        run.stage_completed("round", {"tool": "search"}, outcome="tool_call")  # v2
        run.stage_failed("round", TimeoutError("search timed out"))  # v3
        run.stage_completed("round", {"tool": "fetch"}, outcome="tool_call")  # v4
        run.rollback(2, reason="the search index was stale")  # v5
        run.stage_completed("round", {"answer": 42}, outcome="answered")  # v6
        run.finish()  # v7

        rounds = engine.project(run.id, RoundsTable)
        assert [(r.number, r.version, r.outcome) for r in rounds.rounds] == [
            (1, 2, "tool_call"),
            (2, 3, "failed"),
            (3, 4, "tool_call"),
            (4, 6, "answered"),
        ]
        assert rounds.rounds[1].error_type == "TimeoutError"
        mark = Rollback(version=5, reason="the search index was stale")
        assert [r.rolled_back for r in rounds.rolled_back] == [mark, mark]
        assert [r.number for r in rounds.live] == [1, 4]
        latest = rounds.latest("round")
        assert latest is not None
        assert latest.result == {"answer": 42}

        before = engine.project(run.id, RoundsTable, at=4)
        assert len(before) == 3
        assert before.rolled_back == ()
        assert getattr(before.latest("round"), "version", None) == 4
        after = engine.project(run.id, RoundsTable, at=5)
        assert [r.number for r in after.live] == [1]
        assert getattr(after.latest("round"), "number", None) == 1
        assert engine.project(run.id, RoundsTable, at=1) == Rounds()

        engine.projections.register(RoundsTable)
        assert engine.projections.get("rounds_table", str(run.id)) == rounds

    def test_rounds_share_their_names_and_errors(self) -> None:
        """Rounds of equal names and errors (each event its own copy) hold one str each."""
        events = [
            fail(v, "".join(["tool_", "round"]), "".join(["HTTP ", "503"])) for v in range(2, 6)
        ]
        rounds = fold(*events).rounds
        assert [(r.stage, r.error) for r in rounds] == [("tool_round", "HTTP 503")] * 4
        parts = {id(part) for r in rounds for part in (r.stage, r.outcome, r.error, r.error_type)}
        assert len(parts) == 4

    def test_rounds_by_number_and_live_numbers_still_answer(self) -> None:
        """`table` maps each number to its round as `rounds` gives it (rollback marks
        included), and `live_numbers` lists the live rounds' numbers, oldest first."""
        state = fold(*LOOP, back(6, 2, "stale"))
        assert dict(state.table) == {round_.number: round_ for round_ in state.rounds}
        assert state.table[4].rolled_back == Rollback(version=6, reason="stale")
        assert list(state.live_numbers) == [1, 2]
        assert len(state) == 4


STEPS = st.lists(
    st.tuples(st.sampled_from(["done", "fail", "back"]), st.integers(min_value=1, max_value=3)),
    max_size=30,
)


class TestAgainstTheStack:
    @settings(max_examples=60, deadline=None)
    @given(steps=STEPS)
    def test_live_rounds_are_the_stack_frames(self, steps: list[tuple[str, int]]) -> None:
        """On any history, live rounds are the stack's frames and every outcome is a round."""
        events: list[Event] = []
        for version, (kind, number) in enumerate(steps, start=2):
            stage = f"s{number}"
            if kind == "done":
                events.append(done(version, stage, {"n": number}))
            elif kind == "fail":
                events.append(fail(version, stage, f"e{number}"))
            else:
                events.append(back(version, number, f"r{number}"))
        state = fold(*events)
        stack = StateStack().fold(events)
        assert [r.version for r in state.live] == [f.version for f in stack.frames]
        assert len(state) == sum(1 for kind, _ in steps if kind != "back")
        assert len(state.live) + len(state.rolled_back) == len(state)
        for stage in ("s1", "s2", "s3"):
            frames = [f for f in stack.frames if f.stage == stage]
            latest = state.latest(stage)
            expected = frames[-1].version if frames else None
            assert (None if latest is None else latest.version) == expected
        assert roundtrip(state) == state


class TestImplicitRoute:
    @pytest.mark.parametrize("steps", [1, 2, 3, 4])
    def test_an_implicit_route_is_a_round_as_a_recorded_one(self, steps: int) -> None:
        """A route an outcome took implicitly is a round of the hub (attempt 0), live while the
        stack holds its frame, as a recorded route is; and it survives a JSON round trip."""
        views = []
        with Engine("memory://") as engine:
            for explicit in (True, False):
                run = hub_history(engine, explicit=explicit)
                run.rollback(steps)
                rounds = engine.project(run.id, RoundsTable)
                stack = engine.project(run.id, StateStack)
                assert [r.version for r in rounds.live] == [f.version for f in stack.frames]
                assert [r.stage for r in rounds.live] == [f.stage for f in stack.frames]
                assert roundtrip(rounds) == rounds
                views.append(
                    [(r.stage, r.outcome, r.attempt, r.rolled_back is None) for r in rounds.rounds]
                )
        assert views[0] == views[1]
        assert views[1][0] == ("hub", "a", 0, True)


class TestFoldInStretches:
    def test_a_subclass_taking_outcomes_its_own_way_folds_them_its_way(self) -> None:
        """A subclass whose own handler (or `apply`) takes outcomes folds them with it, as
        `apply` event by event does, not with the rounds' stretches."""
        events = [(done if v % 3 else fail)(v, "round") for v in range(2, 300)]
        for projection in ignoring(RoundsTable, StageFailed):
            state = applied(projection, events)
            assert len(state.rounds) == 199
            assert projection.fold(events) == state
            assert projection.fold(iter(events)).rounds == state.rounds

    @pytest.mark.parametrize("hub", [True, False])
    def test_a_fold_gives_the_rounds_apply_gives_event_after_event(
        self, engine: Engine, hub: bool
    ) -> None:
        """A fold (stretches of outcomes recorded at once) ends where `apply` one event at a
        time ends, through failures, rollbacks and a hub's implicit routes, at every length."""
        run = hub_history(engine, explicit=not hub, hub=hub)
        run.rollback(2)
        if hub:
            run.stage_failed("b", error="again", error_type="Boom")
            run.stage_completed("b", result={"n": 1})
            run.rollback(1)
            run.stage_completed("b", result={"n": 2})
        events = engine.events(run.id)
        stepwise = PROJECTION.initial()
        for count, event in enumerate(events, 1):
            stepwise = PROJECTION.apply(stepwise, event)
            folded = PROJECTION.fold(events[:count])
            assert folded == stepwise
            assert (folded.rounds, folded.live) == (stepwise.rounds, stepwise.live)
            assert dict(folded.live_by_stage) == dict(stepwise.live_by_stage)
        assert len(stepwise.rounds) >= 6

    @pytest.mark.parametrize("hub", [True, False])
    def test_a_fold_from_restored_rounds_ends_where_apply_ends(
        self, engine: Engine, hub: bool
    ) -> None:
        """A fold started from rounds restored from their snapshot (encoded, decoded) at any
        version ends where `apply` event after event ends, live rounds by stage too."""
        run = hub_history(engine, explicit=not hub, hub=hub)
        run.rollback(2)
        run.stage_completed("b", result={"n": 2})
        events = engine.events(run.id)
        whole = PROJECTION.initial()
        for event in events:
            whole = PROJECTION.apply(whole, event)
        for cut in range(1, len(events)):
            restored = PROJECTION.decode(PROJECTION.encode(PROJECTION.fold(events[:cut])))
            folded = PROJECTION.fold(events[cut:], restored)
            assert folded == whole
            assert dict(folded.live_by_stage) == dict(whole.live_by_stage)


ROUND_STEP = st.tuples(
    st.sampled_from(["done", "done", "fail", "back", "note", "many"]),
    st.sampled_from(["a", "b"]),
    st.integers(1, 4),
)
"""One step of a history `RoundsTable` folds in stretches: an outcome, a rollback of 1 to 4
steps or an event no handler takes (each cutting a stretch), or 150 outcomes of a loop (past
a block of rows, `ROWS_PER_BLOCK`)."""


def rounds_history(steps: list[tuple[str, str, int]]) -> list[Event]:
    """The events of `steps`, versions from 2 (a `many` step: outcomes, one in 7 failed)."""
    events: list[Event] = []
    for kind, stage, count in steps:
        for index in range(150 if kind == "many" else 1):
            version = len(events) + 2
            if kind == "back":
                events.append(back(version, count, f"r{count}"))
            elif kind == "note":
                events.append(NoteAdded(run_id=RID, version=version, key="k", value=count))
            elif kind == "fail" or (kind == "many" and index % 7 == 6):
                events.append(fail(version, stage, f"e{count}", attempt=count))
            else:
                events.append(done(version, stage, {"n": version}, attempt=count))
    return events


def same_rounds(folded: Rounds, applied: Rounds) -> None:
    """`folded` holds what `applied` holds: every round, the live ones, by stage, its JSON."""
    assert folded == applied
    assert (folded.rounds, folded.live) == (applied.rounds, applied.live)
    assert dict(folded.live_by_stage) == dict(applied.live_by_stage)
    assert PROJECTION.encode(folded) == PROJECTION.encode(applied)


class TestRowsFold:
    @settings(max_examples=100, deadline=None)
    @given(st.lists(ROUND_STEP, max_size=12), st.data())
    def test_a_fold_from_any_state_gives_what_apply_gives(
        self, steps: list[tuple[str, str, int]], data: st.DataObject
    ) -> None:
        """From any state `apply` reached (or its JSON round trip, or a pickle of it), a fold
        of any stretch of the events after it (a list or an iterator; rounds pushed as rows,
        across blocks) ends where `apply` ends, and leaves the state it began from as it was,
        however often a fold or `apply` goes on from it."""
        events = rounds_history(steps)
        states = prefixes(PROJECTION, events)
        begin = data.draw(st.integers(0, len(events)), "begin")
        end = data.draw(st.integers(begin, len(events)), "end")
        before = PROJECTION.encode(states[begin])
        pickled = pickle.loads(pickle.dumps(states[begin]))
        for origin in (states[begin], roundtrip(states[begin]), pickled, states[begin]):
            same_rounds(PROJECTION.fold(events[begin:end], origin), states[end])
            same_rounds(PROJECTION.fold(iter(events[begin:end]), origin), states[end])
        assert PROJECTION.encode(states[begin]) == before
        made = PROJECTION.fold(events[begin:end], states[begin])
        same_rounds(pickle.loads(pickle.dumps(made)), states[end])
        if end < len(events):  # the rounds a fold made go on as `apply`'s do, either way
            same_rounds(PROJECTION.fold(events[end:], made), states[-1])
            applied = made
            for event in events[end:]:
                applied = PROJECTION.apply(applied, event)
            same_rounds(applied, states[-1])
        same_rounds(made, states[end])

    def test_folds_going_on_from_one_state_in_threads_each_give_what_apply_gives(self) -> None:
        """Threads folding different outcomes from one shared state at once (the interpreter
        switching between them all the time) each end where `apply` ends, the shared state
        left as it was."""
        shared = PROJECTION.fold(rounds_history([("many", "a", 1), ("back", "a", 3)]))
        before = PROJECTION.encode(shared)
        wrong: list[object] = []

        def work(seed: int) -> None:
            try:
                steps = [("many", "ab"[seed % 2], seed), ("fail", "b", seed), ("many", "a", 1)]
                events = rounds_history(steps)
                expected = applied(PROJECTION, events, shared)
                for _ in range(5):
                    folded = PROJECTION.fold(events, shared)
                    encoded = PROJECTION.encode(folded)
                    if folded != expected or encoded != PROJECTION.encode(expected):
                        wrong.append(seed)
            except BaseException as failure:  # handed to the test's thread
                wrong.append(failure)

        switching_often(work, range(1, 5))
        assert wrong == []
        assert PROJECTION.encode(shared) == before
