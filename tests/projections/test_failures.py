from __future__ import annotations

import json
import pickle
import random
import uuid
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import Event, NoteAdded, StageCompleted, StageFailed
from projections.failures import DEPTH, SPREAD, FailurePatterns, Failures
from projections.immutable import PMap
from tests._helpers import switching_often
from tests.projections._own_way import applied, assert_folds_as_applied, ignoring

RID = uuid.UUID(int=3)
OTHER = uuid.UUID(int=4)
PROJECTION = FailurePatterns()


@attrs.frozen(eq=False)
class KeptFailures(Failures):
    """A user's own patterns class: `apply` keeps it where an outcome changes nothing."""


def done(version: int, stage: str) -> StageCompleted:
    return StageCompleted(run_id=RID, version=version, stage=stage, attempt=1)


def fail(
    version: int, stage: str, error: str = "boom", error_type: str = "Build", **fields: Any
) -> StageFailed:
    fields.setdefault("run_id", RID)
    return StageFailed(
        version=version, stage=stage, attempt=1, error=error, error_type=error_type, **fields
    )


def fold(*events: Event) -> Failures:
    return PROJECTION.fold(events)


def roundtrip(state: Failures) -> Failures:
    return PROJECTION.decode(json.loads(json.dumps(PROJECTION.encode(state), allow_nan=False)))


class TestFailurePatterns:
    def test_empty(self) -> None:
        """Before any failure every count is zero and nothing repeats."""
        state = fold()
        assert (state.total, state.by_stage, state.by_error_type) == (0, {}, {})
        assert state.repeated_signatures == {}
        assert state.consecutive("developer") == 0

    def test_counts_by_stage_and_type(self) -> None:
        """Each failure counts once under its stage, once under its error type and in total."""
        state = fold(
            fail(2, "developer", error_type="KeyError"),
            fail(3, "developer", error_type="Timeout"),
            fail(4, "testing", error_type="KeyError"),
        )
        assert state.by_stage == {"developer": 2, "testing": 1}
        assert state.by_error_type == {"KeyError": 2, "Timeout": 1}
        assert state.total == 3

    def test_consecutive_resets_on_completion(self) -> None:
        """consecutive() counts failures since the stage's last completion."""
        state = fold(fail(2, "d"), fail(3, "d"), done(4, "d"), fail(5, "d"))
        assert state.consecutive("d") == 1
        assert state.by_stage == {"d": 3}

    def test_other_stage_completion_keeps_streak(self) -> None:
        """A completion of another stage does not end a stage's streak."""
        state = fold(fail(2, "d"), done(3, "t"), fail(4, "d"))
        assert state.consecutive("d") == 2
        assert state.consecutive("t") == 0

    def test_completion_without_streak_is_noop(self) -> None:
        """A completion of a stage that has no streak leaves the state as it is."""
        state = fold(fail(2, "d"))
        assert PROJECTION.apply(state, done(3, "t")) is state

    def test_repeated_signatures_only_repeats(self) -> None:
        """repeated_signatures holds only (stage, type, error) triples seen more than once."""
        state = fold(
            fail(2, "d", "disk full", "OSError"),
            fail(3, "d", "disk full", "OSError"),
            fail(4, "d", "disk full", "OSError"),
            fail(5, "d", "other", "OSError"),
            fail(6, "t", "disk full", "OSError"),
        )
        assert state.repeated_signatures == {("d", "OSError", "disk full"): 3}
        assert state.count("d", "OSError", "other") == 1
        assert state.count("x", "y", "z") == 0

    def test_every_error_different(self) -> None:
        """When every error differs all are counted and none repeats."""
        state = fold(*(fail(v, "d", f"error {v}") for v in range(2, 502)))
        assert len(state.signatures) == 500
        assert state.repeated_signatures == {}
        assert state.total == 500

    def test_signatures_are_pmaps(self) -> None:
        """Signature counts are kept in hash-trie maps, not copied dicts."""
        state = fold(fail(2, "d"), fail(3, "d"))
        assert isinstance(state.signatures, PMap)
        assert isinstance(state.repeats, PMap)

    def test_across_runs(self) -> None:
        """Failures of different runs of a pipeline add up in one state."""
        state = fold(fail(2, "d", "x"), fail(2, "d", "x", run_id=OTHER))
        assert state.repeated_signatures == {("d", "Build", "x"): 2}
        assert state.consecutive("d") == 2

    def test_scope_is_pipeline(self) -> None:
        """Persistent use keeps one state per pipeline."""
        assert FailurePatterns.scope == "pipeline"

    def test_earlier_state_unchanged(self) -> None:
        """A new failure leaves the earlier state's counts as they were."""
        before = fold(fail(2, "d"))
        PROJECTION.apply(before, fail(3, "d"))
        assert before.total == 1
        assert before.repeated_signatures == {}

    def test_roundtrip(self) -> None:
        """Counts, streaks and signatures survive encode, strict JSON and decode."""
        state = fold(fail(2, "d", "a"), fail(3, "d", "a"), done(4, "d"), fail(5, "t", "b", "E"))
        decoded = roundtrip(state)
        assert decoded == state
        assert decoded.repeated_signatures == {("d", "Build", "a"): 2}
        assert roundtrip(fold()) == fold()


class TestRecentFailures:
    def test_the_newest_five_are_kept_newest_last(self) -> None:
        """recent keeps the five newest failures; last(stage) finds a stage's newest among them."""
        state = fold(*(fail(n, "a" if n < 4 else "b", f"e{n}") for n in range(1, 8)))
        assert state.recent == tuple(("a" if n < 4 else "b", "Build", f"e{n}") for n in range(3, 8))
        assert (state.last("a"), state.last("b"), state.last("c")) == (
            ("Build", "e3"),
            ("Build", "e7"),
            None,
        )
        assert roundtrip(state).recent == state.recent


def history(seed: int, runs: int, steps: int) -> list[Event]:
    """Interleaved failures and completions of two stages by `runs` runs, from `seed`."""
    rng = random.Random(seed)
    ids = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(runs)]
    events: list[Event] = []
    for version in range(2, steps + 2):
        run_id, stage = rng.choice(ids), rng.choice("ab")
        if rng.random() < 0.55:
            error = rng.choice(["x", "y", "z"])
            events.append(fail(version, stage, error, rng.choice("EF"), run_id=run_id))
        else:
            events.append(StageCompleted(run_id=run_id, version=version, stage=stage, attempt=1))
    return events


def forgotten(events: list[Event], gone: set[uuid.UUID]) -> Failures:
    """The patterns of `events` with the runs `gone` forgotten one after another."""
    state = fold(*events)
    for run_id in sorted(gone):
        own = [event for event in events if event.run_id == run_id]
        state = PROJECTION.forget_run(roundtrip(state), run_id, own)
    return state


class TestForgetRun:
    @pytest.mark.parametrize("seed", range(300))
    def test_an_exact_forget_equals_a_fold_of_the_kept_events(self, seed: int) -> None:
        """Forgetting runs gives a fold of the other runs' events, or says it is not exact."""
        rng = random.Random(seed)
        events = history(seed, runs=rng.randint(2, 12), steps=rng.randint(1, 120))
        ids = sorted({event.run_id for event in events})
        gone = set(rng.sample(ids, rng.randint(1, len(ids))))
        state = forgotten(events, gone)
        kept = fold(*(event for event in events if event.run_id not in gone))
        assert (state == kept) if state.exact else (state.total == kept.total)

    def test_most_random_forgets_are_exact(self) -> None:
        """The windows suffice for most histories of up to 60 events (else compact refolds)."""
        exact = 0
        for seed in range(200):
            rng = random.Random(seed)
            events = history(seed, runs=rng.randint(2, 12), steps=rng.randint(1, 60))
            ids = sorted({event.run_id for event in events})
            exact += forgotten(events, {rng.choice(ids)}).exact
        assert exact >= 180

    def test_old_runs_are_forgotten_exactly_however_long_the_history(self) -> None:
        """Runs older than the windows leave the streaks and recent failures exact."""
        rng = random.Random(7)
        ids = [uuid.UUID(int=index) for index in range(1, 401)]
        events: list[Event] = []
        for index, run_id in enumerate(ids):
            for stage in "ab":
                if rng.random() < 0.5:
                    events.append(fail(2, stage, rng.choice("xy"), run_id=run_id))
                if stage == "a" or index % 50:  # "b" keeps failing now and then
                    events.append(StageCompleted(run_id=run_id, version=3, stage=stage, attempt=1))
        state = forgotten(events, set(ids[:100]))
        assert state.exact
        assert state == fold(*(event for event in events if event.run_id not in set(ids[:100])))

    def test_a_streak_across_a_forgotten_completion(self) -> None:
        """Forgetting the run whose completion ended a streak makes the streak continue."""
        events = [fail(2, "d", run_id=OTHER), done(3, "d"), fail(4, "d", run_id=OTHER)]
        state = PROJECTION.forget_run(fold(*events), RID, [done(3, "d")])
        assert state.consecutive("d") == 2
        assert state.exact

    def test_a_run_beyond_the_windows_makes_the_state_inexact(self) -> None:
        """A run owning every completion the state still keeps is not guessed away."""
        third = uuid.UUID(int=5)
        later = [
            StageCompleted(run_id=OTHER, version=v, stage="d", attempt=1)
            for v in range(2, DEPTH + 3)
        ]
        between = [fail(v, "d", run_id=third) for v in range(2, DEPTH + 3)]
        history = [event for pair in zip(later, between, strict=True) for event in pair]
        state = PROJECTION.forget_run(fold(fail(2, "d"), *history), OTHER, later)
        assert not state.exact
        assert not PROJECTION.exact(state)
        kept = fold(fail(2, "d"), *between)  # what a fold of the kept events says
        assert kept.consecutive("d") == DEPTH + 2

    def test_a_run_completing_again_with_no_failure_between_is_kept_once(self) -> None:
        """The same run's completions with no failure between take one place in the window,
        so forgetting it after many of them is still exact."""
        later = [
            StageCompleted(run_id=OTHER, version=v, stage="d", attempt=1)
            for v in range(2, DEPTH + 3)
        ]
        state = PROJECTION.forget_run(fold(fail(2, "d"), *later), OTHER, later)
        assert state.exact
        assert state == fold(fail(2, "d"))
        assert state.consecutive("d") == 1


STEP = st.tuples(
    st.sampled_from(["fail", "fail", "done", "delete"]),
    st.integers(0, 3) | st.integers(0, 39),  # few runs: a deletion takes many recent failures
    st.integers(0, 3),
    st.integers(0, 2),
)
"""One step of a random history: what happens, to which run, stage and error."""


def replayed(steps: list[tuple[str, int, int, int]]) -> tuple[Failures, Failures]:
    """The patterns of `steps` with each deletion forgotten as it comes, and a fold of the
    kept runs' events alone."""
    ids = [uuid.UUID(int=index + 1) for index in range(40)]
    own: dict[int, list[Event]] = {index: [] for index in range(40)}
    gone: set[int] = set()
    state, history = PROJECTION.initial(), []
    for kind, run, stage, error in steps:
        if run in gone or (kind == "delete" and not own[run]):
            continue
        if kind == "delete":
            state = PROJECTION.forget_run(roundtrip(state), ids[run], own[run])
            gone.add(run)
            continue
        version, name = len(own[run]) + 2, "abcd"[stage]
        event: Event = (
            fail(version, name, "xyz"[error], run_id=ids[run])
            if kind == "fail"
            else StageCompleted(run_id=ids[run], version=version, stage=name, attempt=1)
        )
        own[run].append(event)
        history.append((run, event))
        state = PROJECTION.apply(state, event)
    return state, fold(*(event for run, event in history if run not in gone))


class TestForgetRunProperty:
    @settings(max_examples=500, deadline=None)
    @given(st.lists(STEP, max_size=250))
    def test_forgetting_as_deletions_come_equals_a_fold_of_the_kept_runs(
        self, steps: list[tuple[str, int, int, int]]
    ) -> None:
        """Interleaved runs deleted midway leave a fold of the rest, or a state marked inexact."""
        state, kept = replayed(steps)
        assert (state.total, state.by_stage, state.signatures) == (
            kept.total,
            kept.by_stage,
            kept.signatures,
        )
        if state.exact:
            assert state == kept

    @pytest.mark.parametrize("seed", range(100))
    def test_failure_heavy_histories_of_many_runs(self, seed: int) -> None:
        """Many runs failing between rare completions (the windows' limits) forget exactly or
        say they did not."""
        rng = random.Random(seed)
        runs, deleting, completing = 40, rng.choice([0.02, 0.1]), rng.choice([0.01, 0.03])
        steps = []
        for _ in range(rng.choice([200, 500])):
            roll, run = rng.random(), rng.randrange(runs)
            kind = (
                "delete" if roll < deleting else "done" if roll < deleting + completing else "fail"
            )
            steps.append((kind, run, rng.randrange(2), rng.randrange(3)))
        state, kept = replayed(steps)
        assert state.total == kept.total
        if state.exact:
            assert state == kept

    def test_recent_failures_the_tail_lost_make_the_state_inexact(self) -> None:
        """A run owning the newest failures the state keeps leaves the older ones unknown."""
        events = [fail(2, "a", run_id=OTHER)] + [fail(v, "a") for v in range(3, 30)]
        state = PROJECTION.forget_run(fold(*events), RID, events[1:])
        assert (state.total, state.exact) == (1, False)


class TestEqualityAndRepr:
    def test_an_inexact_state_never_equals_a_rebuild(self) -> None:
        """`exact` takes part in equality: same numbers, inexact, is not a rebuild's equal."""
        state = fold(fail(2, "a"), done(3, "a"))
        assert state == attrs.evolve(state, exact=True)
        assert state != attrs.evolve(state, exact=False)

    def test_the_repr_shows_exactly_what_equality_compares(self) -> None:
        """The repr names `exact` and leaves out the forgetting bookkeeping equality ignores."""
        state = fold(fail(2, "a"), done(3, "a"), fail(4, "a"))
        bare = attrs.evolve(state, tracks={}, cut=frozenset(), tail=())
        assert state == bare
        assert repr(state) == repr(bare)
        assert "exact=True" in repr(state)
        assert repr(attrs.evolve(state, exact=False)) != repr(state)
        assert "tracks" not in repr(state)
        assert "tail" not in repr(state)


class TestFoldSkipsUnchangingCompletions:
    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_a_fold_gives_the_state_apply_gives_event_after_event(self, seed: int) -> None:
        """A fold (completions that change nothing skipped inline) ends where `apply` one
        event at a time ends, its bookkeeping for forgetting runs too, at every length."""
        events = history(seed, runs=3, steps=40)
        projection, stepwise = FailurePatterns(), Failures()
        for count, event in enumerate(events, 1):
            stepwise = projection.apply(stepwise, event)
            folded = projection.fold(events[:count])
            assert folded == stepwise
            assert (folded.tracks, folded.tail, folded.cut) == (
                stepwise.tracks,
                stepwise.tail,
                stepwise.cut,
            )


class TestStretchFold:
    @pytest.mark.parametrize("seed", [4, 5])
    def test_a_long_fold_of_many_runs_ends_where_apply_ends(self, seed: int) -> None:
        """A fold of 600 outcomes of 40 runs (segments past `SPREAD` runs, tracks cut past
        `DEPTH`, windows trimmed), from the start or from a state part-way, ends where `apply`
        one event at a time ends, its bookkeeping too."""
        events = history(seed, runs=40, steps=560)
        burst = [uuid.UUID(int=1000 + n) for n in range(SPREAD + 1)]  # one past `SPREAD`
        events.append(StageCompleted(run_id=burst[0], version=562, stage="a", attempt=1))
        events += [fail(v, "a", run_id=burst[v % len(burst)]) for v in range(563, 602)]
        projection, stepwise = FailurePatterns(), Failures()
        states = [stepwise]
        for event in events:
            stepwise = projection.apply(stepwise, event)
            states.append(stepwise)
        assert any(s.fails is None for track in stepwise.tracks.values() for s in track)
        assert stepwise.cut
        for start in (0, 1, 37, 300):
            folded = projection.fold(events[start:], states[start])
            assert folded == stepwise
            assert (folded.tracks, folded.tail, folded.cut) == (
                stepwise.tracks,
                stepwise.tail,
                stepwise.cut,
            )
        for end in (1, 2, 64, 65, 599):
            assert projection.fold(events[:end]) == states[end]


MOVE = st.tuples(
    st.sampled_from(["fail", "fail", "fail", "done", "routed", "note", "delete", "fails", "dones"]),
    st.integers(0, 2) | st.integers(0, SPREAD + 3),  # few runs, or past `SPREAD` of them
    st.integers(0, 1),
    st.integers(0, 1),
)
"""One step of a history folded in stretches: an outcome (a routed verdict: attempt 0), an
event no handler takes (cutting a stretch), a run's deletion (`forget_run` as it comes), or
a burst: failures of more runs than `SPREAD`, completions of more runs than `DEPTH`."""


def stepped(moves: list[tuple[str, int, int, int]]) -> tuple[list[Event], list[Failures]]:
    """The events of `moves` after the last deletion and the state `apply` gives before each
    and after the last (from the state the deletion's `forget_run` left)."""
    ids = [uuid.UUID(int=index + 1) for index in range(SPREAD + 4)]
    own: dict[int, list[Event]] = {}
    events: list[Event] = []
    states = [PROJECTION.initial()]
    state = states[0]
    bursts = {"fails": ("fail", SPREAD + 1), "dones": ("done", DEPTH + 1)}
    moves = [
        (bursts[kind][0], (run + offset) % len(ids), stage, error)
        if kind in bursts
        else (kind, run, stage, error)
        for kind, run, stage, error in moves
        for offset in range(bursts[kind][1] if kind in bursts else 1)
    ]
    for kind, run, stage, error in moves:
        if kind == "delete":
            if own.get(run):
                state = PROJECTION.forget_run(state, ids[run], own.pop(run))
                events, states = [], [state]  # the folds checked start here
            continue
        version, name = len(own.get(run, [])) + 2, "ab"[stage]
        event: Event
        if kind == "fail":
            event = fail(version, name, "xy"[error], "EF"[error], run_id=ids[run])
        elif kind == "note":
            event = NoteAdded(run_id=ids[run], version=version, key="k", value=1)
        else:
            attempt = 1 if kind == "done" else 0
            event = StageCompleted(run_id=ids[run], version=version, stage=name, attempt=attempt)
        own.setdefault(run, []).append(event)
        events.append(event)
        state = PROJECTION.apply(state, event)
        states.append(state)
    return events, states


def same(folded: Failures, applied: Failures) -> None:
    """`folded` is `applied`: its patterns and its bookkeeping for forgetting runs."""
    assert folded == applied
    assert (folded.tracks, folded.tail, folded.cut, folded.recent) == (
        applied.tracks,
        applied.tail,
        applied.cut,
        applied.recent,
    )


class TestStretchFoldProperty:
    @settings(max_examples=300, deadline=None)
    @given(st.lists(MOVE, max_size=160), st.data())
    def test_a_fold_from_any_state_gives_what_apply_gives_at_every_cut(
        self, moves: list[tuple[str, int, int, int]], data: st.DataObject
    ) -> None:
        """From any state `apply` reached (or forgetting a run left, or a snapshot or pickle of
        it restored), a fold of any stretch of the events after it ends where `apply` ends,
        and leaves the state it started from as it was."""
        events, states = stepped(moves)
        start = data.draw(st.integers(0, len(events)), "start")
        end = data.draw(st.integers(start, len(events)), "end")
        before = PROJECTION.encode(states[start])
        pickled = pickle.loads(pickle.dumps(states[start]))
        for origin in (states[start], roundtrip(states[start]), pickled):
            same(PROJECTION.fold(events[start:end], origin), states[end])
            same(PROJECTION.fold(iter(events[start:end]), origin), states[end])
        same(pickle.loads(pickle.dumps(PROJECTION.fold(events[start:end], pickled))), states[end])
        assert PROJECTION.encode(states[start]) == before
        if end < len(events):  # the state a fold made goes on as `apply`'s does
            made = PROJECTION.fold(events[start:end], states[start])
            same(PROJECTION.fold(events[end:], made), states[-1])

    def test_a_subclass_taking_outcomes_its_own_way_folds_them_its_way(self) -> None:
        """A subclass whose own handler (or `apply`) takes outcomes folds them with it, as
        `apply` event by event does, not with the patterns' stretches."""
        events = history(6, runs=5, steps=300)
        for projection in ignoring(FailurePatterns, StageFailed):
            state = applied(projection, events)
            assert state.total == 0 < sum(isinstance(event, StageFailed) for event in events)
            same(projection.fold(events), state)

    @pytest.mark.parametrize(
        ("start_state", "outcome"),
        [
            (KeptFailures(), StageCompleted(run_id=RID, version=2, stage="b", attempt=0)),
            (KeptFailures(), done(2, "b")),
            (KeptFailures(), fail(2, "b")),
            (Failures(by_stage=PMap({"b": 1}), tracks={}), done(2, "b")),
            (Failures(streaks=PMap()), StageCompleted(run_id=RID, version=2, stage="b", attempt=0)),
        ],
    )
    def test_a_fold_from_a_state_apply_keeps_as_it_is_gives_what_apply_gives(
        self, start_state: Failures, outcome: Event
    ) -> None:
        """From a state whose patterns `apply` keeps as they are (a subclass of `Failures`, a
        mapping other than a dict), a fold gives the very state `apply` gives, its class too."""
        assert_folds_as_applied(PROJECTION, start_state, outcome)

    def test_folds_from_one_state_in_threads_each_give_what_apply_gives(self) -> None:
        """Threads folding different outcomes from one shared state at once (the interpreter
        switching between them all the time) each end where `apply` ends, the shared state
        left as it was."""
        shared = fold(*history(8, runs=SPREAD + 2, steps=200))
        before = PROJECTION.encode(shared)
        wrong: list[int] = []

        def work(seed: int) -> None:
            events = history(seed, runs=SPREAD + 2, steps=300)
            expected = applied(PROJECTION, events, shared)
            for _ in range(5):
                folded = PROJECTION.fold(events, shared)
                if folded != expected or PROJECTION.encode(folded) != PROJECTION.encode(expected):
                    wrong.append(seed)

        switching_often(work, range(4))
        assert wrong == []
        assert PROJECTION.encode(shared) == before
