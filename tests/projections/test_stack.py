from __future__ import annotations

import copy
import gc
import json
import pickle
import random
import tracemalloc
import uuid
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import DECIDED, JSON, Event, RunStarted, StageCompleted, StageFailed, StateRolledBack
from events.table import derive_states, expand, hub_of, initial_state, lookup, read_table
from projections.immutable import ROWS_PER_BLOCK, RowList
from projections.stack import Frame, Stack, StateStack
from tests._helpers import REVIEW, PausedThread, hub_table, switching_often
from tests.projections._own_way import applied, ignoring

RID = uuid.UUID(int=1)
PROJECTION = StateStack()
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def started(table: JSON = None) -> RunStarted:
    return RunStarted(
        run_id=RID,
        version=1,
        pipeline="code-review",
        table=REVIEW.to_dict() if table is None else table,
    )


def done(version: int, stage: str, result: JSON = None, **fields: Any) -> StageCompleted:
    fields.setdefault("attempt", 1)
    return StageCompleted(run_id=RID, version=version, stage=stage, result=result, **fields)


def fail(version: int, stage: str, error: str = "boom", **fields: Any) -> StageFailed:
    fields.setdefault("error_type", "BuildException")
    fields.setdefault("attempt", 1)
    return StageFailed(run_id=RID, version=version, stage=stage, error=error, **fields)


def back(version: int, steps: int) -> StateRolledBack:
    return StateRolledBack(run_id=RID, version=version, steps=steps)


def fold(*events: Event) -> Stack:
    return PROJECTION.fold(events)


def roundtrip(state: Stack) -> Stack:
    return PROJECTION.decode(json.loads(json.dumps(PROJECTION.encode(state), allow_nan=False)))


HAPPY = (
    started(),
    done(2, "project_analysis", {"project_type": "python"}),
    done(3, "code_review", {"comments": 2}),
    fail(4, "developer", attempt=1, duration=1.5),
    done(5, "developer", {"patch": "v2"}, attempt=2),
)


class TestLookup:
    def test_explicit_rows(self) -> None:
        """Each explicit row of the table maps (source, outcome) to its dest."""
        table = lookup(REVIEW.to_dict())
        assert table[("project_analysis", "completed")] == "code_review"
        assert table[("testing", "failed")] == "developer"

    def test_wildcard_expands_to_non_final_states(self) -> None:
        """A '*' row applies to every non-final state, and to no final state."""
        table = lookup(REVIEW.to_dict())
        for state in ("project_analysis", "code_review", "developer", "testing"):
            assert table[(state, "aborted")] == "aborted"
        assert ("done", "aborted") not in table
        assert ("aborted", "aborted") not in table

    def test_own_row_beats_wildcard(self) -> None:
        """A state's own row for an outcome wins over a '*' row for that outcome."""
        table = lookup(
            {
                "initial": "a",
                "final": ["z"],
                "states": ["a", "b", "z"],
                "transitions": [["*", "failed", "z"], ["a", "failed", "a"], ["a", "ok", "b"]],
            }
        )
        assert table[("a", "failed")] == "a"
        assert table[("b", "failed")] == "z"

    def test_wildcard_without_states_list(self) -> None:
        """Without a 'states' list the states are derived from initial and the rows."""
        table = lookup(
            {"initial": "a", "final": ["z"], "transitions": [["a", "ok", "b"], ["*", "x", "z"]]}
        )
        assert table == {("a", "ok"): "b", ("a", "x"): "z", ("b", "x"): "z"}

    def test_malformed_table_gives_empty_lookup(self) -> None:
        """A table that is not an object, or has malformed rows, never raises."""
        assert lookup(None) == {}
        assert lookup({"transitions": [["a", "ok"], 3, ["a", "ok", "b"]]}) == {("a", "ok"): "b"}

    @pytest.mark.parametrize(
        "table",
        [
            None,
            [],
            {},
            {"initial": 3, "hub": ["h"], "transitions": [["a", "ok", "b"]]},
            {"initial": "a", "hub": "h", "final": ["z"], "transitions": [["a", "ok", "z"]]},
        ],
    )
    def test_read_table_is_initial_state_lookup_and_hub_of(self, table: Any) -> None:
        """`read_table` gives what `initial_state`, `lookup` and `hub_of` give one by one."""
        assert read_table(table) == (initial_state(table), lookup(table), hub_of(table))

    def test_a_table_without_star_rows_reads_as_its_rows_whatever_its_states(self) -> None:
        """Tables of the same rows, no `"*"` row, give their rows' lookup whatever states and
        initial state they name; a `"*"` row then expands over each table's own states."""
        rows = [["a", "ok", "b"], ["b", "ok", "z"]]
        moves = {("a", "ok"): "b", ("b", "ok"): "z"}
        for states in (["a", "b", "z"], ["a", "b", "q", "z"], ["z", "b", "a"]):
            table = {"initial": states[0], "final": ["z"], "states": states, "transitions": rows}
            assert lookup(table) == moves
        starred = [*rows, ["*", "x", "z"]]
        for states in (["a", "b", "z"], ["a", "b", "q", "z"]):
            table = {"initial": "a", "final": ["z"], "states": states, "transitions": starred}
            expected = moves | {(state, "x"): "z" for state in states if state != "z"}
            assert lookup(table) == expected

    def test_same_table_again_read_as_it_is_now(self) -> None:
        """A table looked up again after a change in place (a row, `initial` where `states`
        is missing) gives its new expansion, and the copy given back is the caller's own."""
        table: dict[str, Any] = {"initial": "a", "final": ["z"], "transitions": [["a", "ok", "b"]]}
        first = lookup(table)
        first[("a", "ok")] = "mutated"
        assert lookup(table) == {("a", "ok"): "b"}
        table["transitions"][0][2] = "c"
        assert lookup(table) == {("a", "ok"): "c"}
        table["transitions"].append(["*", "x", "z"])
        assert lookup(table) == {("a", "ok"): "c", ("a", "x"): "z", ("c", "x"): "z"}
        table["initial"] = "q"
        assert lookup(table) == {
            ("a", "ok"): "c",
            ("a", "x"): "z",
            ("c", "x"): "z",
            ("q", "x"): "z",
        }
        moved = {("a", "ok"): "c", ("a", "x"): "z", ("q", "x"): "z", ("z", "x"): "z"}
        assert lookup(dict(table, final=["c"])) == moved


_NAMES = st.sampled_from(["a", "b", "z", "*", "ok", "x"])
_ROW = st.lists(_NAMES, min_size=3, max_size=3) | st.sampled_from(
    [["a", "ok"], 3, ("a", "ok", "b"), "abz", "*xz"]
)
_STATES: st.SearchStrategy[Any] = (
    st.none() | st.just([]) | st.just("ab") | st.lists(_NAMES.filter(lambda n: n != "*"))
)
_TABLE = st.fixed_dictionaries(
    {
        "initial": st.none() | _NAMES | st.just(3),
        "final": st.none() | st.just(["z"]) | st.just(["b", "z"]) | st.just(5) | st.just(("z",)),
        "states": _STATES,
        "transitions": st.none() | st.lists(_ROW, max_size=4),
    }
)


def _expected(table: dict[str, Any]) -> Any:
    """A table's lookup made afresh (no look-up kept): its rows, `"*"` rows expanded over its
    states (or those it names), or the error that raises."""
    try:
        rows = [
            (row[0], row[1], row[2])
            for row in table.get("transitions") or ()
            if isinstance(row, list | tuple) and len(row) == 3 and all(type(x) is str for x in row)
        ]
        final = tuple(table.get("final") or ())
        states = table.get("states") or derive_states(initial_state(table), rows, final)
        return {(source, outcome): dest for source, outcome, dest in expand(rows, states, final)}
    except Exception as error:
        return type(error)


class TestLookupKept:
    @settings(max_examples=1500, deadline=None)
    @given(st.lists(_TABLE, min_size=1, max_size=5), st.randoms(use_true_random=False))
    def test_tables_in_a_row_each_read_afresh(self, tables: list[Any], rng: Any) -> None:
        """Tables looked up one after another (some the same rows and final states under
        other states, initial state or `"*"` rows) each give their own lookup, or the error
        their lookup made afresh raises."""
        for table in tables:
            for variant in (table, {**table, "states": rng.choice([["q"], ["a", "z"], None])}):
                try:
                    found: Any = lookup(variant)
                except Exception as error:
                    found = type(error)
                assert found == _expected(variant), variant

    def test_a_row_spelled_as_text_is_not_taken_for_a_row_of_its_letters(self) -> None:
        """A table whose one row is the text "abc" (no row: skipped) is not kept as a table
        of the row ["a", "b", "c"]: a table of that row, under the same or other states and
        initial state, reads its row, not the text table's empty lookup."""
        states = ["a", "b", "c", "z"]
        text = {"initial": "a", "final": ["z"], "states": states, "transitions": ["abc"]}
        row = {**text, "transitions": [["a", "b", "c"]]}
        other = {**row, "initial": "q", "states": [*states, "q"]}
        for table in (row, other):
            assert lookup(text) == {}
            assert lookup(table) == {("a", "b"): "c"}

    def test_a_star_row_table_after_a_rows_only_one_of_the_same_final_states(self) -> None:
        """A table of the same final states whose rows differ by one `"*"` row, or one whose
        rows are the same but spelled as tuples, is not taken for the table read before."""
        rows = [["a", "ok", "b"], ["b", "ok", "z"]]
        base = {"initial": "a", "final": ["z"], "states": ["a", "b", "z"], "transitions": rows}
        assert lookup(base) == {("a", "ok"): "b", ("b", "ok"): "z"}
        starred = {**base, "transitions": [*rows, ["*", "x", "z"]]}
        assert lookup(starred) == {
            ("a", "ok"): "b",
            ("b", "ok"): "z",
            ("a", "x"): "z",
            ("b", "x"): "z",
        }
        assert lookup(base) == {("a", "ok"): "b", ("b", "ok"): "z"}
        other_final = {**base, "final": ["b", "z"]}
        assert lookup(other_final) == {("a", "ok"): "b", ("b", "ok"): "z"}
        with pytest.raises(TypeError):
            lookup({**base, "final": 5})  # as before: a final that is no list of states


class TestStateStack:
    def test_initial_state_is_empty(self) -> None:
        """Before any event the stack is empty, with no top and no current state."""
        state = PROJECTION.initial()
        assert (state.top, state.depth, state.frames, state.current) == (None, 0, (), None)

    def test_run_started_sets_initial_state(self) -> None:
        """After RunStarted the current state is the table's initial state."""
        state = fold(started())
        assert state.current == "project_analysis"
        assert state.initial == "project_analysis"
        assert state.depth == 0

    def test_completed_pushes_frame_with_dest(self) -> None:
        """A StageCompleted pushes a frame whose state is the table's dest for its outcome."""
        state = fold(started(), done(2, "project_analysis", {"a": 1}, duration=5.2, timestamp=T0))
        assert state.top == Frame(
            state="code_review",
            stage="project_analysis",
            outcome="completed",
            attempt=1,
            failed=False,
            result={"a": 1},
            error=None,
            error_type=None,
            duration=5.2,
            version=2,
            timestamp=T0,
        )
        assert state.current == "code_review"
        assert state.depth == 1

    def test_failed_pushes_frame_with_error(self) -> None:
        """A StageFailed pushes a failed frame holding the error and no result."""
        state = fold(*HAPPY[:3], fail(4, "developer", "oops", error_type="KeyError"))
        top = state.top
        assert top is not None
        assert (top.state, top.failed, top.result) == ("developer", True, None)
        assert (top.error, top.error_type, top.outcome) == ("oops", "KeyError", "failed")
        assert top.timestamp.tzinfo is not None

    def test_wildcard_outcome(self) -> None:
        """An outcome matched only by a '*' row leads to that row's dest."""
        state = fold(*HAPPY[:3], done(4, "developer", outcome="aborted"))
        assert state.current == "aborted"

    def test_missing_row_uses_stage(self) -> None:
        """An outcome with no row in the table leads to the event's stage, without raising."""
        state = fold(started(), done(2, "project_analysis", outcome="weird"))
        assert state.current == "project_analysis"

    def test_outcome_before_run_started(self) -> None:
        """Without a table every frame's state is its stage."""
        state = fold(done(2, "developer"))
        assert state.current == "developer"
        assert state.initial is None

    def test_frames_oldest_first(self) -> None:
        """`frames` lists the frames oldest first and `top` is the newest."""
        state = fold(*HAPPY)
        assert [frame.version for frame in state.frames] == [2, 3, 4, 5]
        assert state.top == state.frames[-1]
        assert state.depth == 4
        assert state.current == "testing"

    def test_rollback_pops_frames(self) -> None:
        """StateRolledBack(steps=k) removes the k newest frames."""
        state = fold(*HAPPY, back(6, 2))
        assert [frame.version for frame in state.frames] == [2, 3]
        assert state.current == "developer"

    def test_rollback_to_empty_returns_to_initial(self) -> None:
        """Rolling back every frame leaves the run in its initial state."""
        state = fold(*HAPPY, back(6, 4))
        assert state.depth == 0
        assert state.current == "project_analysis"

    def test_rollback_past_bottom_does_not_raise(self) -> None:
        """A rollback deeper than the stack empties it instead of raising."""
        assert fold(*HAPPY[:2], back(3, 5)).depth == 0

    def test_push_after_rollback(self) -> None:
        """Frames pushed after a rollback sit on the remaining ones."""
        state = fold(*HAPPY, back(6, 3), done(7, "code_review", {"comments": 0}))
        assert [frame.version for frame in state.frames] == [2, 7]
        assert state.latest_result("code_review") == {"comments": 0}

    def test_earlier_states_unchanged(self) -> None:
        """Folding more events leaves an earlier state's frames as they were."""
        before = fold(*HAPPY[:3])
        after = PROJECTION.fold([HAPPY[3], back(5, 2)], before)
        assert [frame.version for frame in before.frames] == [2, 3]
        assert [frame.version for frame in after.frames] == [2]

    def test_latest_result_skips_failures(self) -> None:
        """latest_result gives the newest successful result of a stage, ignoring failures."""
        state = fold(*HAPPY, fail(6, "testing"), done(7, "developer", {"patch": "v3"}, attempt=3))
        assert state.latest_result("developer") == {"patch": "v3"}
        assert state.latest_result("testing") is None
        assert state.latest_result("nope") is None

    def test_latest_result_after_rollback(self) -> None:
        """A result popped by a rollback is no longer the latest result."""
        state = fold(*HAPPY, back(6, 1))
        assert state.latest_result("developer") is None
        assert state.latest_result("code_review") == {"comments": 2}

    def test_all_latest_results(self) -> None:
        """all_latest_results maps each stage with a successful frame to its newest result."""
        state = fold(*HAPPY, fail(6, "testing"), done(7, "developer", {"patch": "v3"}, attempt=3))
        assert state.all_latest_results() == {
            "project_analysis": {"project_type": "python"},
            "code_review": {"comments": 2},
            "developer": {"patch": "v3"},
        }

    def test_failures(self) -> None:
        """failures() lists failed frames oldest first, optionally of one stage."""
        state = fold(*HAPPY, fail(6, "testing"), fail(7, "developer", attempt=3))
        assert [frame.version for frame in state.failures()] == [4, 6, 7]
        assert [frame.version for frame in state.failures("developer")] == [4, 7]
        assert state.failures("code_review") == ()

    def test_failures_popped_by_rollback(self) -> None:
        """A failure popped by a rollback is no longer listed."""
        assert fold(*HAPPY[:4], back(5, 1)).failures() == ()

    def test_scope_is_run(self) -> None:
        """Persistent use keeps one stack per run."""
        assert StateStack.scope == "run"

    def test_frames_share_their_names_and_errors(self) -> None:
        """Frames of equal names and errors (each event its own copy) hold one str each."""
        events: list[Event] = [started()]
        for version in range(2, 6):
            stage, error = "".join(["project_", "analysis"]), "".join(["bo", "om"])
            events.append(fail(version, stage, error, attempt=version - 1))
        frames = PROJECTION.fold(events).frames
        assert frames[0] == attrs.evolve(
            frames[-1], attempt=1, version=2, timestamp=frames[0].timestamp
        )
        assert (
            len({id(part) for f in frames for part in (f.stage, f.outcome, f.error, f.error_type)})
            == 4
        )


class TestStateStackCodec:
    def test_roundtrip_initial(self) -> None:
        """The empty stack survives encode, strict JSON and decode."""
        assert roundtrip(PROJECTION.initial()) == PROJECTION.initial()

    def test_roundtrip_after_rollback(self) -> None:
        """A stack with frames, failures and a rollback survives a JSON round trip."""
        state = fold(*HAPPY, back(6, 1), fail(7, "developer", attempt=3, timestamp=T0))
        decoded = roundtrip(state)
        assert decoded == state
        assert decoded.frames == state.frames
        assert decoded.table == state.table
        assert decoded.top is not None
        assert decoded.top.timestamp == T0

    def test_decoded_stack_folds_on(self) -> None:
        """A decoded stack keeps its table, so later outcomes find their dest."""
        decoded = roundtrip(fold(*HAPPY[:2]))
        assert PROJECTION.fold([done(3, "code_review")], decoded).current == "developer"

    def test_encoded_timestamps_are_iso(self) -> None:
        """Frame timestamps are encoded as ISO 8601 strings."""
        encoded = PROJECTION.encode(fold(started(), done(2, "project_analysis", timestamp=T0)))
        assert encoded["frames"][0][-1] == T0.isoformat()

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(
            st.one_of(
                st.tuples(
                    st.sampled_from(["done", "fail"]),
                    st.sampled_from(["developer", "testing", "code_review"]),
                    st.sampled_from(["completed", "failed", "aborted", "odd"]),
                ),
                st.tuples(st.just("back"), st.integers(1, 4), st.none()),
            ),
            max_size=25,
        )
    )
    def test_roundtrip_every_prefix(self, ops: list[tuple[str, Any, Any]]) -> None:
        """Every state reached by outcomes and rollbacks equals its JSON round trip."""
        state = fold(started())
        for version, (kind, arg, outcome) in enumerate(ops, start=2):
            event: Event
            if kind == "back":
                event = back(version, arg)
            elif kind == "done":
                event = done(version, arg, {"v": version, "f": 0.5}, outcome=outcome)
            else:
                event = fail(version, arg, f"e{version % 3}", outcome=outcome)
            state = PROJECTION.apply(state, event)
            assert roundtrip(state) == state

    def test_states_differ_when_frames_differ(self) -> None:
        """Equality compares frames: stacks with different frames are unequal."""
        state = fold(*HAPPY)
        assert state != attrs.evolve(state, frame_list=state.frame_list.pop(1))

    def test_malformed_data_raises(self) -> None:
        """Decoding data that is not an encoded stack raises instead of guessing."""
        with pytest.raises(KeyError):
            PROJECTION.decode({"initial": "a"})


class TestStoredOddValues:
    def test_a_stored_failure_without_error_text_folds(self) -> None:
        """A stored StageFailed whose error and error_type are null (decode trusts the store)
        folds as it did before interning, keeping None, not a bare intern TypeError."""
        from events.codec import decode, encode

        event = fail(2, "project_analysis")
        topic, state = encode(event)
        state["error"] = state["error_type"] = None
        stored = decode(topic, state, RID, 2)
        top = fold(started(), stored).top
        assert top is not None
        assert (top.error, top.error_type) == (None, None)


def hubbed(*, explicit: bool, count: int = 1, history: list[Event] | None = None) -> list[Event]:
    """`count` rounds of: a completes, b fails, each routed from the hub (`hub_table`), the
    route recorded (`explicit`) or taken implicitly by the outcome; after `history` if given."""
    history = [started(hub_table(hub=True).to_dict())] if history is None else history
    for _ in range(count):
        for stage, make in (("a", done), ("b", fail)):
            if explicit:
                route = {"attempt": DECIDED, "outcome": stage}
                history.append(done(len(history) + 1, "hub", **route))
            history.append(make(len(history) + 1, stage))
    return history


def frame_view(stack: Stack) -> list[tuple[object, ...]]:
    """Each frame but its version and time: state, stage, outcome, attempt, failed."""
    return [(f.state, f.stage, f.outcome, f.attempt, f.failed) for f in stack.frames]


def restored(stack: Stack, history: list[Event]) -> Stack:
    """`stack` through a time-travel snapshot (strict JSON) and back, its frames remade."""

    def source(gt: int, lte: int) -> Any:
        return iter([e for e in history if gt < e.version <= lte])

    data = json.loads(json.dumps(PROJECTION.snapshot(stack), allow_nan=False))
    return PROJECTION.restore(data, source)


class TestImplicitRoute:
    @pytest.mark.parametrize("steps", [1, 2, 3, 4])
    def test_an_implicit_route_pushes_the_frames_a_recorded_one_does(self, steps: int) -> None:
        """Frames and the current state after implicit routes match recorded ones, rolled back
        or not (the route is a frame of its own, decided: attempt 0)."""
        stacks = []
        for explicit in (True, False):
            history = hubbed(explicit=explicit)
            stacks.append(fold(*history, back(len(history) + 1, steps)))
        assert frame_view(stacks[1]) == frame_view(stacks[0])
        assert stacks[1].current == stacks[0].current
        assert frame_view(fold(*hubbed(explicit=False)))[:2] == [
            ("a", "hub", "a", DECIDED, False),
            ("hub", "a", "completed", 1, False),
        ]

    def test_a_table_without_a_hub_pushes_one_frame_per_outcome(self) -> None:
        """Without a declared hub no route frame is made for an outcome."""
        table = hub_table(hub=False).to_dict()
        stack = fold(started(table), done(2, "hub", attempt=DECIDED, outcome="a"), done(3, "a"))
        assert [f.stage for f in stack.frames] == ["hub", "a"]

    @pytest.mark.parametrize("steps", [1, 2, 3, 4])
    def test_a_snapshot_restores_implicit_routes_and_lone_ones(self, steps: int) -> None:
        """Restored from a snapshot, the frames are the folded ones: a route and its outcome
        (two frames of one event), a route whose outcome was rolled back, across read pages."""
        history = hubbed(explicit=False, count=100)
        history.append(back(len(history) + 1, 1))  # b's outcome undone: its route stays alone
        hubbed(explicit=False, count=40, history=history)
        history.append(back(len(history) + 1, steps))
        stack = fold(*history)
        assert stack.hub is not None
        assert len(stack.hub.lone) == 1 + steps % 2
        again = restored(stack, history)
        assert again.frames == stack.frames
        assert again == stack
        assert restored(again, history).frames == stack.frames
        hubbed(explicit=False, count=1, history=history)
        assert PROJECTION.fold(history[-2:], again) == fold(*history)


def shape_ops() -> st.SearchStrategy[list[tuple[str, Any, Any]]]:
    """Outcomes (of the hub's nodes too), rollbacks (some deep) and snapshot points."""
    return st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(["done", "fail"]),
                st.sampled_from(["a", "b", "hub", "developer", "testing"]),
                st.sampled_from(["completed", "failed", "a", "b", "odd"]),
            ),
            st.tuples(st.just("back"), st.integers(1, 6), st.none()),
            st.tuples(st.just("snapshot"), st.none(), st.none()),
        ),
        max_size=60,
    )


def shaped_history(table: JSON, ops: list[tuple[str, Any, Any]]) -> list[list[Event]]:
    """The run `ops` make, in batches: a new one after each ``snapshot`` op."""
    batches: list[list[Event]] = [[started(table)]]
    version = 1
    for kind, arg, outcome in ops:
        if kind == "snapshot":
            batches.append([])
            continue
        version += 1
        if kind == "back":
            batches[-1].append(back(version, arg))
        elif kind == "done":
            batches[-1].append(done(version, arg, outcome=outcome))
        else:
            batches[-1].append(fail(version, arg, outcome=outcome))
    return [batch for batch in batches if batch]


class TestStackShape:
    @settings(max_examples=150, deadline=None)
    @given(ops=shape_ops(), hub=st.booleans(), reseed=st.integers(0, 8))
    def test_its_snapshot_is_the_folded_stacks(
        self, ops: list[tuple[str, Any, Any]], hub: bool, reseed: int
    ) -> None:
        """After each batch the shape's snapshot is StateStack's of the fold (seeded from the
        start or from a restored stack), unless a hub's rollback went below its packed frames."""
        from projections.stack import StackShape

        batches = shaped_history(hub_table(hub=hub).to_dict(), ops)
        history = [event for batch in batches for event in batch]
        shape = StackShape.started(started(hub_table(hub=hub).to_dict()))
        if len(batches[0]) > 1:
            shape.advance(batches[0][1:])
        for number, batch in enumerate(batches[1:], start=1):
            version = batch[0].version - 1
            if number == reseed:  # a handle that read the run: from its restored stack
                shape = StackShape.of(restored(fold(*history[:version]), history), version)
            shape.advance(batch)
            stack = fold(*history[: batch[-1].version])
            if not shape.known:
                assert hub, "only a hub's table needs packed frames' states"
                return
            assert shape.depth == stack.depth
            assert shape.snapshot() == PROJECTION.snapshot(stack)

    def test_deep_rollbacks_unpack_only_what_they_pop(self) -> None:
        """A rollback below the packed frames pops their newest versions, splitting a range."""
        from projections.stack import StackShape

        history: list[Event] = [started()]
        for version in range(2, 12):
            history.append(done(version, "developer"))
        shape = StackShape.started(started())
        shape.advance(history[1:6])
        shape.snapshot()  # versions 2..6 packed as one range
        history += [fail(12, "developer"), back(13, 4), done(14, "developer")]
        shape.advance(history[6:])
        stack = fold(*history)
        assert [frame.version for frame in stack.frames] == [2, 3, 4, 5, 6, 7, 8, 14]
        assert shape.snapshot() == PROJECTION.snapshot(stack)
        assert shape.snapshot()["ranges"] == "2+6,6"

    def test_events_not_following_it_leave_it_unknown(self) -> None:
        """Events that skip a version (another writer's between) make the shape unknown."""
        from projections.stack import StackShape

        shape = StackShape.started(started())
        shape.advance([done(3, "developer")])
        assert not shape.known

    @pytest.mark.parametrize("per_batch", [1, 3, 50])
    @pytest.mark.parametrize("steps", [1, 2, 3])
    def test_implicit_routes_and_lone_ones_shape_as_folded(
        self, per_batch: int, steps: int
    ) -> None:
        """A hub's implicit routes (two frames of one event) and a route whose outcome was
        rolled back (lone) shape as StateStack folds them, batch after batch."""
        from projections.stack import StackShape

        history = hubbed(explicit=False, count=30)
        history.append(back(len(history) + 1, 1))  # b's outcome undone: its route stays alone
        hubbed(explicit=False, count=10, history=history)
        history.append(back(len(history) + 1, steps))
        hubbed(explicit=False, count=2, history=history)
        shape, lone = StackShape.started(started(hub_table(hub=True).to_dict())), set[int]()
        for start in range(1, len(history), per_batch):
            batch = history[start : start + per_batch]
            shape.advance(batch)
            if not shape.known:  # a rollback below the packed frames: their states not held
                shape = StackShape.of(fold(*history[: batch[-1].version]), batch[-1].version)
            stack = fold(*history[: batch[-1].version])
            assert shape.snapshot() == PROJECTION.snapshot(stack)
            lone |= stack.hub.lone if stack.hub else set()
        assert lone, "a lone route was shaped"

    @pytest.mark.parametrize("steps", [1, 127, 128, 129, 1000, 1500])
    def test_the_shape_of_a_restored_stack_walked_in_part(self, steps: int) -> None:
        """A restored stack popped into its deferred frames (a page made, ranges split) and
        pushed onto shapes as its own snapshot says, and goes on as the fold does."""
        from projections.stack import StackShape

        history: list[Event] = [started()]
        for version in range(2, 4000):
            make = done if version % 3 else fail
            history.append(make(version, "developer") if version % 5 else back(version, 1))
        stack = restored(fold(*history), history)
        history.append(back(len(history) + 1, steps))
        history += [done(len(history) + 1, "developer"), done(len(history) + 2, "testing")]
        stack = PROJECTION.fold(history[-3:], stack)
        shape = StackShape.of(stack, len(history))
        assert shape.snapshot() == PROJECTION.snapshot(fold(*history))
        history += [back(len(history) + 1, 3), done(len(history) + 2, "developer")]
        shape.advance(history[-2:])
        assert shape.snapshot() == PROJECTION.snapshot(fold(*history))

    def test_it_holds_a_machine_word_per_version_followed(self) -> None:
        """The versions followed since the last snapshot cost a machine word each, not an int
        object each: a writer holds them per live handle, a short run's for its whole life."""
        from projections.stack import StackShape

        shape, frames = StackShape.started(started()), 10_000
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            shape.advance([done(version, "developer") for version in range(2, frames + 2)])
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert shape.depth == frames
        assert held < 12 * frames


class TestFoldInPlace:
    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["done", "fail", "back", "many"]),
                st.sampled_from(["developer", "testing", "code_review"]),
                st.integers(1, 4),
            ),
            max_size=20,
        ),
        st.booleans(),
        st.integers(0, 20),
    )
    def test_a_fold_is_its_events_applied_one_at_a_time(
        self, ops: list[tuple[str, str, int]], hub: bool, cut: int
    ) -> None:
        """`fold` (outcomes pushed as rows in place, across blocks) gives the stack, the
        encoding and the snapshot that `apply` gives event by event, from the start or
        from a decoded stack, and leaves the stack it went on from as it was."""
        events: list[Event] = [started(hub_table(hub=hub).to_dict())]
        for kind, stage, number in ops:
            for _ in range(150 if kind == "many" else 1):
                version = len(events) + 1
                if kind == "back":
                    events.append(back(version, number))
                elif kind == "fail" or version % 7 == 0:
                    events.append(fail(version, stage, f"e{number}", attempt=number))
                else:
                    events.append(done(version, stage, {"v": version}, attempt=number))
        applied = PROJECTION.initial()
        for event in events:
            applied = PROJECTION.apply(applied, event)
        assert PROJECTION.fold(events) == applied
        assert PROJECTION.encode(PROJECTION.fold(events)) == PROJECTION.encode(applied)
        assert PROJECTION.snapshot(PROJECTION.fold(events)) == PROJECTION.snapshot(applied)
        start = PROJECTION.fold(events[: cut + 1])
        before = PROJECTION.encode(start)
        assert PROJECTION.fold(events[cut + 1 :], start) == applied
        assert PROJECTION.fold(events[cut + 1 :], roundtrip(start)) == applied
        assert PROJECTION.encode(start) == before

    def test_a_subclass_handling_outcomes_its_own_way_folds_them_its_way(self) -> None:
        """A subclass whose own handler (or `apply`) takes outcomes folds them with it, as
        `apply` event by event does, not with the stack's in-place push."""
        events = [started(), *[(done if v % 3 else fail)(v, "developer") for v in range(2, 300)]]
        for projection in ignoring(StateStack, StageFailed):
            state = applied(projection, events)
            assert projection.fold(events) == state
            assert projection.fold(iter(events)).depth == state.depth == 199

    def test_an_outcome_after_a_new_table_takes_its_state_from_it(self) -> None:
        """After a second `RunStarted` (refused by the machine, not by a fold), an outcome
        pushed by `apply` takes its frame's state from the new table, as `fold` does, not
        from the newest frame of the same stage and outcome."""
        table = REVIEW.to_dict()
        ends = {**table, "transitions": [*table["transitions"], ["developer", "completed", "done"]]}
        events = [started(), done(2, "developer"), started(ends), done(3, "developer")]
        applied = PROJECTION.initial()
        for event in events:
            applied = PROJECTION.apply(applied, event)
        assert [frame.state for frame in applied.frames] == ["testing", "done"]
        assert PROJECTION.fold(events) == applied

    def test_a_stack_pickled_holds_its_own_frames_only(self) -> None:
        """A stack pickled after others were pushed from it holds none of their frames (they
        share its newest block), and comes back equal and as able to go on."""
        older = fold(started(), done(2, "developer", {"note": "kept"}))
        newer = PROJECTION.apply(older, done(3, "developer", {"note": "pushed later"}))
        data = pickle.dumps(older)
        assert b"kept" in data
        assert b"pushed later" not in data
        assert pickle.loads(data) == older
        assert PROJECTION.apply(pickle.loads(data), done(3, "developer", {"note": "x"})).depth == 2
        assert copy.copy(older) == older
        assert newer.depth == 2

    def test_a_failing_event_names_itself(self) -> None:
        """An outcome the in-place push cannot take raises the handlers' `ProjectionError`."""
        from events.values import build, fields_of
        from projections.errors import ProjectionError

        bad = build(StageCompleted, {**fields_of(done(70, "developer")), "outcome": ["odd"]})
        with pytest.raises(ProjectionError, match="version 70"):
            PROJECTION.fold([started(), *[done(v, "developer") for v in range(2, 70)], bad])


def versions(state: Stack) -> list[int]:
    """The versions of the stack's frames, oldest first, as a walk of them reads them."""
    frames = state.frame_list.to_tuple()
    assert len(frames) == state.depth
    return [frame.version for frame in frames]


class TestThreadedPushes:
    @pytest.mark.parametrize("late", ["apply", "fold"])
    @pytest.mark.parametrize("meanwhile", ["apply", "fold"])
    def test_a_push_held_up_before_its_append_never_changes_a_sealed_block(
        self, late: str, meanwhile: str
    ) -> None:
        """A push from a shared stack held up between taking its newest block and appending
        to it, while another thread's pushes from the same stack fill and seal that block,
        leaves each of the three stacks with exactly its own frames."""
        shared = fold(started(), *[done(v, "developer") for v in range(2, 12)])
        late_event = done(5000, "testing")
        more = [done(v, "developer") for v in range(12, 12 + ROWS_PER_BLOCK + 5)]
        if late == "apply":
            paused = PausedThread(
                RowList.push_row, "tip.extend(row)", lambda: PROJECTION.apply(shared, late_event)
            )
        else:
            paused = PausedThread(
                StateStack._pushed_in_place,
                "tip.extend(row)",
                lambda: PROJECTION.fold([late_event], shared),
            )
        paused.start()
        went_on = shared
        if meanwhile == "apply":
            for event in more:
                went_on = PROJECTION.apply(went_on, event)
        else:
            went_on = PROJECTION.fold(more, shared)
        late_state = paused.finish()
        assert versions(shared) == list(range(2, 12))
        assert versions(late_state) == [*range(2, 12), 5000]
        assert versions(went_on) == list(range(2, 12 + len(more)))

    def test_many_threads_going_on_from_shared_stacks_each_get_their_own_frames(self) -> None:
        """Threads pushing and popping (by `apply`, a listed fold and a streamed one) from
        stacks any thread made before, switching every microsecond, each get the frames a
        list of versions given the same steps holds, and no stack changes after it was made."""
        shared = fold(started(), *[done(v, "developer") for v in range(2, 100)])
        made: list[tuple[Stack, list[int]]] = [(shared, list(range(2, 100)))]
        failures: list[BaseException] = []

        def work(seed: int) -> None:
            chance = random.Random(seed)
            try:
                for turn in range(12):
                    state, expected = made[chance.randrange(len(made))]
                    events: list[Event] = []
                    expected = list(expected)
                    for at in range(chance.randrange(1, 2 * ROWS_PER_BLOCK)):
                        version = seed * 1_000_000 + turn * 1_000 + at
                        if chance.random() < 0.05:
                            steps = chance.randrange(1, 40)
                            events.append(back(version, steps))
                            del expected[len(expected) - min(steps, len(expected)) :]
                        else:
                            events.append(done(version, "developer"))
                            expected.append(version)
                    how = chance.choice(["apply", "fold", "stream"])
                    if how == "apply":
                        for event in events:
                            state = PROJECTION.apply(state, event)
                    else:
                        state = PROJECTION.fold(events if how == "fold" else iter(events), state)
                    assert versions(state) == expected
                    made.append((state, expected))
            except BaseException as failure:  # handed to the test's thread
                failures.append(failure)

        switching_often(work, range(1, 9))
        assert failures == []
        assert len(made) == 1 + 8 * 12
        for state, expected in made:
            assert versions(state) == expected
