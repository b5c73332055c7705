from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from freezegun import freeze_time
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine, Pipeline, Run
from engine.errors import InvalidArgument
from events import Event, NoteAdded, RunStarted, StageCompleted, StageFailed, StateRolledBack
from events.values import evolve
from projections import RUNNING, Folding, RunIndex, RunSummary, folding, run_index
from projections.base import folds_with
from projections.errors import ProjectionError
from projections.immutable import PList
from projections.run_index import STATUS_NOTE, PackedRuns, StateList, _states, pack_states
from tests._helpers import REVIEW, calls_to, hub_history
from tests.projections._own_way import applied, ignoring, prefixes

OTHER = Pipeline(
    "other", initial="a", transitions=[("a", "completed", "b"), ("a", "failed", "a")], final=["b"]
)
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def fill(engine: Engine) -> dict[str, uuid.UUID]:
    """Four runs an hour apart: finished, failing, other pipeline, child."""
    ids: dict[str, uuid.UUID] = {}
    with freeze_time(T0, tick=True) as clock:
        done = engine.start_run(REVIEW, labels={"team": "core", "env": "ci"})
        done.stage_completed("project_analysis", result={})
        done.finish("succeeded")
        ids["done"] = done.id
        clock.move_to(T0 + timedelta(hours=1))
        failing = engine.start_run(REVIEW, labels={"team": "core"})
        for stage in ("project_analysis", "code_review"):
            failing.stage_completed(stage, result={})
        failing.stage_failed("developer", error="x")
        failing.stage_failed("developer", error="x")
        ids["failing"] = failing.id
        clock.move_to(T0 + timedelta(hours=2))
        ids["other"] = engine.start_run(OTHER, labels={"team": "web"}).id
        clock.move_to(T0 + timedelta(hours=3))
        ids["child"] = engine.start_run(OTHER, parent=failing).id
    return ids


def eventful_hub_run(engine: Engine, *, explicit: bool) -> Run:
    """`hub_history`'s run, then a rollback, a resumable failure, a pausing note and more
    outcomes after it."""
    run = hub_history(engine, explicit=explicit)
    run.rollback(2)
    run.stage_failed("b", error="x", details={"task_id": "t", "writes": []})
    run.stage_completed("b")
    run.note(STATUS_NOTE, {"status": "waiting", "reason": "input"})
    run.stage_completed("b_done")
    return run


class TestRuns:
    def test_lists_newest_first_with_their_summary(self, engine: Engine) -> None:
        """runs() gives every run, newest first, with state, status, attempts and failures."""
        ids = fill(engine)
        runs = engine.runs()
        assert [r.run_id for r in runs] == [ids["child"], ids["other"], ids["failing"], ids["done"]]
        failing = runs[2]
        assert (failing.status, failing.state, failing.attempts, failing.failures) == (
            RUNNING,
            "developer",
            4,
            2,
        )
        assert runs[3].status == "succeeded"
        assert runs[3].finished is not None
        assert runs[3].state == "code_review"
        assert runs[0].parent_run_id == ids["failing"]

    @pytest.mark.parametrize(
        ("query", "expected"),
        [
            ({"status": "succeeded"}, ["done"]),
            ({"status": RUNNING}, ["child", "other", "failing"]),
            ({"pipeline": "other"}, ["child", "other"]),
            ({"label": "team=core"}, ["failing", "done"]),
            ({"label": ["team=core", "env=ci"]}, ["done"]),
            ({"label": {"team": "web"}}, ["other"]),
            ({"label": "team=nobody"}, []),
            ({"since": T0 + timedelta(hours=2)}, ["child", "other"]),
            ({"limit": 1}, ["child"]),
            ({"pipeline": "code-review", "status": RUNNING}, ["failing"]),
        ],
    )
    def test_filters(self, engine: Engine, query: dict[str, object], expected: list[str]) -> None:
        """Each filter keeps exactly the runs that match it, newest first."""
        ids = fill(engine)
        assert [r.run_id for r in engine.runs(**query)] == [ids[n] for n in expected]  # type: ignore[arg-type]

    def test_parent_filter_lists_child_runs(self, engine: Engine) -> None:
        """parent= lists the runs started with that parent."""
        ids = fill(engine)
        assert [r.run_id for r in engine.runs(parent=ids["failing"])] == [ids["child"]]
        assert engine.runs(parent=str(ids["done"])) == []

    def test_reflects_every_committed_event_at_once(self, engine: Engine) -> None:
        """A run recorded after a listing shows up, up to date, in the next listing."""
        run = engine.start_run(REVIEW)
        assert engine.runs()[0].state == "project_analysis"
        run.stage_completed("project_analysis", result={})
        run.rollback(steps=1)
        run.stage_completed("project_analysis", result={})
        assert engine.runs()[0].state == "code_review"
        assert engine.runs()[0].version == 4

    @pytest.mark.parametrize(
        ("query", "argument"),
        [
            ({"label": "team"}, "label"),
            ({"label": "=x"}, "label"),
            ({"limit": 0}, "limit"),
            ({"limit": 2.5}, "limit"),
            ({"since": datetime(2026, 1, 1)}, "since"),
            ({"since": "yesterday"}, "since"),
            ({"status": "done"}, "status"),
            ({"status": 5}, "status"),
            ({"parent": "not-a-run"}, "parent"),
        ],
    )
    def test_bad_arguments_are_named(
        self, engine: Engine, query: dict[str, object], argument: str
    ) -> None:
        """A malformed label, limit, since, status or parent raises InvalidArgument naming it."""
        with pytest.raises(InvalidArgument, match=f"'{argument}'"):
            engine.runs(**query)  # type: ignore[arg-type]


class TestRunSummary:
    def test_to_json_has_the_stable_fields(self, engine: Engine) -> None:
        """to_json carries the documented field names with JSON values."""
        fill(engine)
        data = engine.runs(status="succeeded")[0].to_json()
        for field in ("run_id", "pipeline", "status", "state", "started", "finished"):
            assert isinstance(data[field], str)
        assert (data["attempts"], data["failures"], data["labels"]) == (
            1,
            0,
            {"team": "core", "env": "ci"},
        )

    def test_encode_decode_round_trip(self, engine: Engine) -> None:
        """The stored form of a summary decodes to an equal summary."""
        ids = fill(engine)
        summary = engine.project(ids["failing"], RunIndex)
        assert isinstance(summary, RunSummary)
        index = RunIndex()
        assert index.decode(index.encode(summary)) == summary

    def test_stored_stack_is_packed_and_unpacked_when_walked(self) -> None:
        """The stored stack of states is one string, unpacked only when a rollback walks it."""
        index = RunIndex()
        run_id = uuid.uuid4()
        summary = RunSummary(run_id, "p", RUNNING, "b", T0, T0, version=8)
        summary = attrs.evolve(summary, states=PList.of(["a", "a", "b", "a\\,*1", "a", "a"]))
        data = index.encode(summary)
        assert (data["state_names"], data["state_codes"]) == (["a", "b", "a\\,*1"], "0*2,1,2,0*2")
        decoded = index.decode(data)
        assert decoded is not None
        first: Any = next(decoded.states.newest_cells())
        assert first == (None, decoded.states.cells)  # not walked: one deferred tail
        assert decoded == summary
        back = StateRolledBack(run_id=run_id, version=9, timestamp=T0, steps=3)
        rolled = index.apply(decoded, back)
        assert rolled is not None
        assert (rolled.state, len(rolled.states)) == ("a\\,*1", 3)

    @given(
        st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 1500)), max_size=8),
        st.integers(0, 5000),
    )
    def test_a_stored_stack_reads_back_from_its_newest_end(
        self, runs: list[tuple[str, int]], popped: int
    ) -> None:
        """A decoded stack of states, popped any number of times, holds the states below them
        and packs again to those states, whatever pages its runs were split across."""
        names, codes = pack_states(runs)
        states = [name for name, count in runs for _ in range(count)]
        data = {"state_names": names, "state_codes": codes, "state_count": len(states)}
        stack = _states(data).pop(popped)
        left = states[: max(len(states) - popped, 0)]
        assert list(stack) == left
        assert [name for name, count in stack.runs() for _ in range(count)] == left
        assert list(_states(data)) == states

    @given(
        st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 1500)), max_size=8),
        st.integers(0, 5000),
        st.lists(st.sampled_from(["a", "b", "hub"]), max_size=3),
    )
    def test_a_restored_stack_popped_and_pushed_stores_what_a_folded_one_does(
        self, runs: list[tuple[str, int]], popped: int, pushed: list[str]
    ) -> None:
        """A decoded stack rolled back (across pages or not), then pushed onto (a hub's implicit
        route pushes two frames), packs to the very codes of the same stack never stored."""
        states = [name for name, count in runs for _ in range(count)]
        names, codes = pack_states(PList.of(states).runs())  # as `encode` stores them
        data = {"state_names": names, "state_codes": codes, "state_count": len(states)}
        restored, folded = _states(data).pop(popped), PList.of(states).pop(popped)
        for name in pushed:
            restored, folded = restored.push(name), folded.push(name)
        assert pack_states(restored.runs()) == pack_states(folded.runs())
        assert restored == folded
        assert len(restored) == len(folded)

    @given(
        st.lists(
            st.tuples(st.sampled_from(["a", "b", "c", "a,*1", ""]), st.integers(1, 30)),
            max_size=40,
        )
    )
    def test_packed_stacks_are_coded_run_by_run(self, runs: list[tuple[str, int]]) -> None:
        """`pack_states` (each distinct run coded once) writes what coding each run in turn
        writes, and `PackedRuns` reads those runs back, whole or below a read of its newest."""
        names: dict[str, int] = {}
        codes = []
        for name, count in runs:
            index = names.setdefault(name, len(names))
            codes.append(str(index) if count == 1 else f"{index}*{count}")
        assert pack_states(runs) == pack_states(iter(runs)) == (list(names), ",".join(codes))
        packed = PackedRuns(list(names), ",".join(codes))
        assert list(packed) == runs
        newest, below = packed.newest(7)
        states = [name for name, count in runs for _ in range(count)]
        assert newest == states[::-1][:7]
        assert [name for name, count in below or [] for _ in range(count)] == states[:-7]

    def test_a_rollback_after_a_restore_reads_only_the_newest_states(self) -> None:
        """Popping a few states of a deep stored stack leaves the older runs packed, unread."""
        runs = [("ab"[n % 2], 1 + n % 3) for n in range(20_000)]
        names, codes = pack_states(runs)
        data = {"state_names": names, "state_codes": codes, "state_count": 40_000}
        stack = _states(data).pop(3)
        tail = [cells for item, cells in stack.newest_cells() if cells is not None]
        (deferred,) = tail
        assert len(codes) - 10_000 < deferred.about.end < len(codes)  # one page read

    def test_duration_runs_to_the_finish(self, engine: Engine) -> None:
        """duration is finished - started for a finished run."""
        with freeze_time(T0) as clock:
            run = engine.start_run(REVIEW)
            clock.move_to(T0 + timedelta(seconds=90))
            run.finish("cancelled")
        assert engine.runs()[0].duration == 90.0


class TestImplicitRoute:
    @pytest.mark.parametrize("steps", [0, 1, 2, 3])
    def test_a_run_taking_implicit_routes_is_summarised_as_one_recording_them(
        self, engine: Engine, steps: int
    ) -> None:
        """State, attempts and failures read alike with implicit and recorded routes, and a
        rollback lands in the same state (the route is a step; no route is an attempt)."""
        seen = []
        for explicit in (True, False):
            run = hub_history(engine, explicit=explicit)
            if steps:
                run.rollback(steps)
            summary = engine.project(run.id, RunIndex)
            assert summary is not None
            listed = {s.run_id: s for s in engine.runs()}[run.id]
            assert (listed.state, listed.attempts) == (summary.state, summary.attempts)
            seen.append((summary.state, summary.attempts, summary.failures))
            assert summary.state == run.state
        assert seen[0] == seen[1]
        assert seen[1][1:] == (4, 1)


class TestFold:
    def test_a_subclass_taking_outcomes_its_own_way_folds_them_its_way(
        self, engine: Engine
    ) -> None:
        """A subclass whose own handler (or `apply`) takes outcomes folds them with it, as
        `apply` event by event does, not with the summary's stretches."""
        run = engine.start_run(OTHER)
        for _ in range(40):
            run.stage_failed("a", error="x")
        run.stage_completed("a")
        events = engine.events(run.id)
        for projection in ignoring(RunIndex, StageCompleted, StageFailed):
            state = applied(projection, events)
            assert state is not None
            assert state.state == "a"  # outcomes moved nothing
            assert projection.fold(events) == state
            assert projection.fold(iter(events)) == state

    @pytest.mark.parametrize("explicit", [True, False])
    def test_a_fold_gives_the_summary_apply_gives_event_after_event(
        self, engine: Engine, explicit: bool
    ) -> None:
        """A fold (stretches of outcomes summed up at once) ends where `apply` one event at a
        time ends, through implicit routes, rollbacks, a pausing note, resumable failures."""
        run = eventful_hub_run(engine, explicit=explicit)
        run.finish("succeeded")
        events = engine.events(run.id)
        index, stepwise = RunIndex(), None
        for count, event in enumerate(events, 1):
            stepwise = index.apply(stepwise, event)
            folded = index.fold(events[:count])
            assert folded == stepwise
            assert folded is not None
            assert stepwise is not None
            assert folded.states.to_tuple() == stepwise.states.to_tuple()
        assert stepwise is not None
        assert stepwise.status == "succeeded"

    def test_a_failing_outcome_names_the_projection_and_event(self, engine: Engine) -> None:
        """An outcome the fold cannot take fails as `apply` fails: a ProjectionError naming it."""
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", result={})
        events = engine.events(run.id)
        broken = evolve(events[1], attempt=None)  # as no check lets an event be made
        with pytest.raises(ProjectionError) as raised:
            RunIndex().fold([events[0], broken])
        assert (raised.value.event_type, raised.value.version) == ("StageCompleted", 2)

    @pytest.mark.parametrize("explicit", [True, False])
    def test_a_fold_from_a_restored_summary_ends_where_apply_ends(
        self, engine: Engine, explicit: bool
    ) -> None:
        """A fold started from a summary restored from its snapshot (encoded, decoded) at any
        version ends where `apply` event after event ends."""
        run = hub_history(engine, explicit=explicit)
        run.rollback(2)
        events = engine.events(run.id)
        index = RunIndex()
        whole = index.fold(events)
        for cut in range(1, len(events)):
            restored = index.decode(index.encode(index.fold(events[:cut])))
            assert index.fold(events[cut:], restored) == whole


MOVES = Pipeline(
    "moves",
    initial="a",
    transitions=[
        ("a", "completed", "b"),
        ("a", "failed", "a"),
        ("a", "again", "a"),
        ("b", "completed", "a"),
        ("b", "failed", "b"),
        ("b", "again", "a"),
        ("b", "stop", "end"),
    ],
    final=["end"],
)
"""A table whose outcomes of one state move a run to different states."""
OUTCOME = st.tuples(
    st.sampled_from(["done", "done", "fail", "verdict", "note"]),
    st.sampled_from(["a", "b", "__graph__"]),
    st.sampled_from(["completed", "again", "failed"]),
)
"""One event of a run of `MOVES`: an outcome (a routed verdict: attempt 0), of a stage or a
framework's own, or an event no handler takes (cutting a stretch)."""


class Counted(str):
    """A state whose comparisons are counted (each walk of a stack compares what it reads)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


class TestStateList:
    def test_a_stack_read_every_few_hundred_pushes_walks_each_state_once(self) -> None:
        """Reading the runs of a stack every 500 pushes (the viewer's first fold packing it
        for a view) reads only the states pushed since, not the whole stack each time."""
        stack: PList[str] = RunSummary(uuid.uuid4(), "p", RUNNING, "a", T0, T0).states
        Counted.compared = 0
        for n in range(1, 20_001):
            stack = stack.push(Counted("ab"[n // 7 % 2]))
            if n % 500 == 0:
                stack.runs()
        assert Counted.compared <= 2 * 20_000
        expected = PList.of(list(stack)).runs()
        run_index.forget_runs()
        assert stack.runs() == expected

    @pytest.mark.parametrize(("look", "states"), [("read", "abc"), ("pack", "abcd")])
    @given(
        ops=st.lists(
            st.tuples(st.sampled_from(["push", "pop", "look", "back"]), st.integers(0, 40))
        )
    )
    def test_runs_are_those_of_the_same_stack_never_read_nor_packed(
        self, look: str, states: str, ops: list[tuple[str, int]]
    ) -> None:
        """Whatever pushes, pops, looks (reads of its runs, or packings of them by
        `pack_states` onto a packing kept) and returns to older stacks came before, a stack's
        runs are, and pack to the very names and codes of, those of a plain list of the same
        states, pushes and pops keep it a StateList, and runs changed after they were read
        are packed as they are."""
        made: list[PList[str]] = [StateList()]
        stack = made[0]
        for op, number in ops:
            if op == "push":
                for index in range(number % 7 + 1):
                    stack = stack.push(states[(number + index // 3) % len(states)])
            elif op == "pop":
                stack = stack.pop(number % 9)
            elif op == "look" and look == "read":
                stack.runs()
            elif op == "look":
                assert pack_states(stack.runs()) == pack_states(PList.of(list(stack)).runs())
            else:
                stack = made[number % len(made)]
            made.append(stack)
        runs = stack.runs()
        runs.append(("changed", 2))
        assert pack_states(runs) == pack_states(list(runs))
        for stack in made:
            assert type(stack) is StateList
            assert stack.runs() == PList.of(list(stack)).runs()
            assert pack_states(stack.runs()) == pack_states(PList.of(list(stack)).runs())

    def test_a_stack_packed_every_few_hundred_pushes_codes_each_run_once(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Packing a stack of alternating states every 500 pushes (the viewer's first fold)
        codes only the runs since the last packing, and gives what packing it afresh gives."""
        coded = calls_to(monkeypatch, run_index, "_code")
        stack: PList[str] = StateList()
        for n in range(1, 20_001):
            stack = stack.push("ab"[n % 2])
            if n % 500 == 0:
                pack_states(stack.runs())
        assert len(coded) <= 2 * 20_000
        packed = pack_states(stack.runs())
        run_index.forget_runs()
        assert (
            pack_states(stack.runs()) == packed == pack_states(list(PList.of(list(stack)).runs()))
        )

    def test_a_push_makes_a_state_list_without_calling_init(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Pushing onto a StateList (once per outcome in the viewer's fold, through `apply`)
        makes a StateList as `PList.push` makes a list, without a second call to __init__."""
        stack: PList[str] = StateList()
        inits = calls_to(monkeypatch, StateList, "__init__")
        for item in "abba":
            stack = stack.push(item)
        assert type(stack) is StateList
        assert stack.runs() == [("a", 1), ("b", 2), ("a", 1)]
        assert inits == []

    def test_a_summary_s_stack_stays_a_state_list_through_its_handlers_and_decode(self) -> None:
        """A summary folded from its events, rolled back and decoded keeps a StateList: the
        viewer's fold of the run index reads its runs incrementally throughout."""
        index = RunIndex()
        run_id = uuid.uuid4()
        summary = index.apply(
            None,
            RunStarted(
                run_id=run_id,
                version=1,
                timestamp=T0,
                pipeline="other",
                table=OTHER.to_dict(),
            ),
        )
        for version in range(2, 6):
            summary = index.apply(
                summary,
                StageFailed(
                    run_id=run_id,
                    version=version,
                    timestamp=T0,
                    stage="a",
                    attempt=1,
                    outcome="failed",
                    error="x",
                ),
            )
        assert summary is not None
        assert type(summary.states) is StateList
        back = index.apply(
            summary, StateRolledBack(run_id=run_id, version=6, timestamp=T0, steps=2)
        )
        assert back is not None
        assert type(back.states) is StateList
        decoded = index.decode(index.encode(back))
        assert decoded is not None
        assert type(decoded.states) is StateList
        assert decoded == back


def moves_history(steps: list[tuple[str, str, str]]) -> list[Event]:
    """A run of `MOVES`: its start, then `steps`."""
    run_id, at = uuid.UUID(int=26), T0
    events: list[Event] = [
        RunStarted(run_id=run_id, version=1, timestamp=at, pipeline="moves", table=MOVES.to_dict())
    ]
    for kind, stage, outcome in steps:
        common: dict[str, Any] = {
            "run_id": run_id, "version": len(events) + 1, "timestamp": at + timedelta(len(events))
        }  # fmt: skip
        if kind == "note":
            events.append(NoteAdded(**common, key="k", value=1))
        elif kind == "fail":
            events.append(StageFailed(**common, stage=stage, attempt=1, outcome=outcome))
        else:
            attempt = 0 if kind == "verdict" else 1
            events.append(StageCompleted(**common, stage=stage, attempt=attempt, outcome=outcome))
    return events


class TestStretchFoldProperty:
    @settings(max_examples=150, deadline=None)
    @given(st.lists(OUTCOME, max_size=40), st.data())
    def test_a_fold_from_any_state_gives_what_apply_gives(
        self, steps: list[tuple[str, str, str]], data: st.DataObject
    ) -> None:
        """From any summary `apply` reached, a fold of any stretch of the events after it
        (outcomes of one state moving the run to different states, framework stages, verdicts)
        gives the summary `apply` gives event by event, its states and attempts too."""
        events = moves_history(steps)
        projection = RunIndex()
        states: list[RunSummary | None] = prefixes(projection, events)
        begin = data.draw(st.integers(0, len(events)), "begin")
        end = data.draw(st.integers(begin, len(events)), "end")
        for given_events in (events[begin:end], iter(events[begin:end])):
            folded = projection.fold(given_events, states[begin])
            assert folded == states[end]
            if folded is not None:
                assert folded.states == states[end].states  # type: ignore[union-attr]
                assert projection.encode(folded) == projection.encode(states[end])

    def test_its_own_apply_leaves_its_fold_to_its_stretches_and_a_subclass_s_does_not(
        self,
    ) -> None:
        """`RunIndex`'s own `apply` (every event moves the version) keeps its fold taking
        outcomes in stretches; a subclass's `apply` takes them its own way."""

        class Own(RunIndex):
            def apply(self, state: RunSummary | None, event: Event) -> RunSummary | None:
                return super().apply(state, event)

        assert folds_with(RunIndex(), RunIndex, StageCompleted, StageFailed)
        assert not folds_with(Own(), RunIndex, StageCompleted, StageFailed)


def _same_summary(got: RunSummary | None, expected: RunSummary | None) -> None:
    """`got` is `expected`: equal, its stack's states, runs, packing and encoding too."""
    assert got == expected
    if got is None or expected is None:
        return
    index = RunIndex()
    assert got.states.to_tuple() == expected.states.to_tuple()
    assert list(got.states) == list(expected.states)
    assert len(got.states) == len(expected.states)
    assert list(got.states.runs()) == list(expected.states.runs())
    assert pack_states(got.states.runs()) == pack_states(expected.states.runs())
    assert index.encode(got) == index.encode(expected)
    if len(expected.states):
        assert got.states.pop().to_tuple() == expected.states.pop().to_tuple()


class TestFolding:
    @settings(max_examples=150, deadline=None)
    @given(st.lists(OUTCOME, max_size=40), st.lists(st.integers(0, 41), max_size=5), st.data())
    def test_a_folding_fed_in_parts_gives_what_apply_gives(
        self, steps: list[tuple[str, str, str]], cuts: list[int], data: st.DataObject
    ) -> None:
        """The run index's folding (its stretch left open between parts), from any state
        `apply` reached, fed the events after it in any parts and asked for its state after
        any of them (a stack made only when walked), gives what `apply` gives event by event:
        states, runs, packing, encoding, pop and iteration alike."""
        events = moves_history(steps)
        index = RunIndex()
        states = prefixes(index, events)
        begin = data.draw(st.integers(0, len(events)), "begin")
        bounds = sorted({begin, len(events), *(c for c in cuts if begin <= c < len(events))})
        fold = folding(index, states[begin])
        for start, end in itertools.pairwise(bounds):
            fold.feed(events[start:end])
            if data.draw(st.booleans(), "ask") or end == len(events):
                _same_summary(fold.state(), states[end])

    @pytest.mark.parametrize("explicit", [True, False])
    def test_a_folding_fed_event_by_event_gives_what_apply_gives(
        self, engine: Engine, explicit: bool
    ) -> None:
        """Fed one event at a time and asked after each, through implicit routes, rollbacks,
        resumable failures and a pausing note, the folding gives `apply`'s summary."""
        run = eventful_hub_run(engine, explicit=explicit)
        events = engine.events(run.id)
        index = RunIndex()
        states = prefixes(index, events)
        fold = folding(index)
        for count, event in enumerate(events, 1):
            fold.feed([event])
            _same_summary(fold.state(), states[count])
        assert "failed_resumable" in {state.status for state in states[1:] if state is not None}

    def test_a_subclass_with_its_own_handler_is_folded_its_own_way(self, engine: Engine) -> None:
        """A subclass taking outcomes its own way gets a plain folding, which gives its
        `apply`'s summary, not the run index's stretch."""
        run = engine.start_run(OTHER)
        for _ in range(10):
            run.stage_failed("a", error="x")
        events = engine.events(run.id)
        for projection in ignoring(RunIndex, StageCompleted, StageFailed):
            fold = folding(projection)
            fold.feed(events[:4])
            fold.feed(events[4:])
            assert fold.state() == applied(projection, events)
            assert type(fold) is Folding

    def test_a_subclass_with_its_own_fold_is_fed_through_it(self, engine: Engine) -> None:
        """A subclass keeping the run index's handlers but folding its own way (its `fold`
        overridden) gets a plain folding, fed through that fold, not the stretch."""
        parts: list[int] = []

        class CountingFolds(RunIndex):
            def fold(self, events: Any, state: Any = None) -> Any:
                events = list(events)
                parts.append(len(events))
                return super().fold(events, state)

        run = engine.start_run(OTHER)
        for _ in range(10):
            run.stage_failed("a", error="x")
        events = engine.events(run.id)
        fold = folding(CountingFolds(), None)
        fold.feed(events[:4])
        fold.feed(events[4:])
        assert type(fold) is Folding
        assert parts == [4, len(events) - 4]
        assert fold.state() == RunIndex().fold(events)

    def test_a_failing_outcome_names_the_folding_s_projection_and_event(
        self, engine: Engine
    ) -> None:
        """An outcome a folding cannot take fails naming the projection (a subclass's own
        name) and that event, not the one before it."""

        class Renamed(RunIndex):
            name = "renamed_index"

        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", result={})
        run.stage_completed("code_review", result={})
        events = engine.events(run.id)
        broken = evolve(events[2], attempt=None)  # as no check lets an event be made
        for projection in (RunIndex(), Renamed()):
            fold = folding(projection)
            fold.feed(events[:2])
            with pytest.raises(ProjectionError) as raised:
                fold.feed([broken])
            assert (raised.value.projection, raised.value.version) == (projection.name, 3)

    def test_an_error_of_the_events_source_is_raised_as_it_is(self) -> None:
        """What the events' source raises mid-stretch (a store failing to decode) reaches the
        caller as it is, not as a ProjectionError naming the outcome before it."""
        events = moves_history([("done", "a", "completed")] * 10)

        def failing() -> Iterator[Event]:
            yield from events[:6]
            raise OSError("disk I/O error")

        with pytest.raises(OSError, match="disk I/O error"):
            RunIndex().fold(failing())


STACK_STEP = st.tuples(
    st.sampled_from(["push", "push", "push", "pop", "runs", "pack", "drop", "restore"]),
    st.integers(0, 3),
    st.sampled_from(["a", "b"]),
)
"""One step on one of four stacks: push a state, pop, read its runs, pack them, let the
stack go, or replace it by its decoded snapshot."""


class TestRunsMemo:
    @settings(max_examples=200, deadline=None)
    @given(st.lists(STACK_STEP, max_size=60))
    def test_runs_stay_right_whatever_stacks_are_let_go(
        self, steps: list[tuple[str, int, str]]
    ) -> None:
        """Stacks grown from one another, read, packed, let go and restored, in any order:
        each stack's runs and packing are always those of its states."""
        index = RunIndex()
        start = RunSummary(uuid.uuid4(), "p", RUNNING, "a", T0, T0)
        stacks: list[PList[str] | None] = [start.states] * 4
        for action, which, state in steps:
            stack = stacks[which] or stacks[(which + 1) % 4] or start.states
            if action == "push":
                stacks[which] = stack.push(state)
            elif action == "pop" and len(stack):
                stacks[which] = stack.pop()
            elif action == "drop":
                stacks[which] = None
            elif action == "restore":
                summary = index.decode(index.encode(evolve(start, states=stack)))
                assert summary is not None
                stacks[which] = summary.states
            else:
                expected = [(name, len(list(group))) for name, group in itertools.groupby(stack)]
                runs = stack.runs()
                assert list(runs) == expected
                if action == "pack":
                    assert pack_states(runs) == pack_states(expected)
