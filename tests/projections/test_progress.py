from __future__ import annotations

import json
import uuid
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ProgressPolicy
from events import Event, ProgressObserved, StageCompleted, StageFailed, StageStarted
from projections.progress import Progress, ProgressState, Verdict
from tests.projections._own_way import applied, ignoring, prefixes

RID = uuid.UUID(int=5)
PROJECTION = ProgressState()
OFF = ProgressPolicy()


def done(version: int, stage: str = "d") -> StageCompleted:
    return StageCompleted(run_id=RID, version=version, stage=stage, attempt=1)


def fail(version: int, stage: str = "d") -> StageFailed:
    return StageFailed(run_id=RID, version=version, stage=stage, attempt=1)


def seen(version: int, **fields: Any) -> ProgressObserved:
    """An observation of every signal: no changed file unless `fields` say otherwise."""
    return ProgressObserved(run_id=RID, version=version, **{"changed_files": 0, **fields})


def observe(version: int, **signals: Any) -> ProgressObserved:
    """An observation of only the signals given (one observer's report)."""
    return ProgressObserved(run_id=RID, version=version, **signals)


def fold(*events: Event) -> Progress:
    return PROJECTION.fold(events)


def roundtrip(state: Progress) -> Progress:
    return PROJECTION.decode(json.loads(json.dumps(PROJECTION.encode(state), allow_nan=False)))


class TestProgressPolicy:
    def test_strict_defaults(self) -> None:
        """strict() limits 50 steps, 3 no-ops, 3 same errors and refuses partial success."""
        assert ProgressPolicy.strict() == ProgressPolicy(
            max_steps=50, max_consecutive_no_ops=3, max_same_error=3, accept_partial=False
        )

    def test_lenient_defaults(self) -> None:
        """lenient() limits 100 steps, 6 no-ops, 5 same errors and accepts partial success."""
        assert ProgressPolicy.lenient() == ProgressPolicy(
            max_steps=100, max_consecutive_no_ops=6, max_same_error=5, accept_partial=True
        )

    def test_overrides(self) -> None:
        """Keyword overrides replace a profile's defaults, including with None."""
        policy = ProgressPolicy.strict(max_steps=10, max_same_error=None, accept_partial=True)
        assert (policy.max_steps, policy.max_consecutive_no_ops) == (10, 3)
        assert (policy.max_same_error, policy.accept_partial) == (None, True)
        assert ProgressPolicy.lenient(accept_partial=False).accept_partial is False

    def test_unknown_override(self) -> None:
        """An override that is not a field is refused."""
        with pytest.raises(TypeError):
            ProgressPolicy.strict(max_stepz=3)

    def test_default_policy_is_off(self) -> None:
        """A policy built without arguments has every limit off."""
        assert (OFF.max_steps, OFF.max_consecutive_no_ops, OFF.max_same_error) == (None,) * 3

    @pytest.mark.parametrize("field", ["max_steps", "max_consecutive_no_ops", "max_same_error"])
    @pytest.mark.parametrize("value", [0, -1, 1.5, "3", True])
    def test_limits_must_be_positive_ints(self, field: str, value: object) -> None:
        """A limit that is not a positive int or None raises ValueError naming the field."""
        with pytest.raises(ValueError, match=field):
            ProgressPolicy(**{field: value})  # type: ignore[arg-type]

    def test_accept_partial_must_be_bool(self) -> None:
        """accept_partial must be a bool; anything else raises ValueError naming it."""
        with pytest.raises(ValueError, match="accept_partial"):
            ProgressPolicy(accept_partial=1)  # type: ignore[arg-type]

    def test_overrides_are_validated(self) -> None:
        """An invalid override of a profile raises like the constructor does."""
        with pytest.raises(ValueError, match="max_consecutive_no_ops"):
            ProgressPolicy.lenient(max_consecutive_no_ops=0)

    def test_frozen(self) -> None:
        """A policy cannot be changed after it is built."""
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            ProgressPolicy.strict().max_steps = 1  # type: ignore[misc]


class TestVerdict:
    def test_decision_checked(self) -> None:
        """A decision other than continue, stuck or partial raises ValueError."""
        with pytest.raises(ValueError, match="decision"):
            Verdict("maybe")

    def test_stopped(self) -> None:
        """stopped is False for continue and True for stuck and partial."""
        assert not Verdict("continue").stopped
        assert Verdict("stuck").stopped
        assert Verdict("partial").stopped


class TestProgressState:
    def test_initial(self) -> None:
        """Before any event every counter is zero and nothing was observed."""
        assert fold() == Progress(0, 0, 0, 0, None, None, None)

    def test_steps_count_outcomes(self) -> None:
        """total_steps counts StageCompleted and StageFailed, not starts or observations."""
        state = fold(
            StageStarted(run_id=RID, version=2, stage="d", attempt=1),
            fail(3),
            done(4),
            seen(5, changed_files=2),
        )
        assert state.total_steps == 2

    @pytest.mark.parametrize(
        "fields",
        [
            {"changed_files": 1},
            {"changed_files": ["a.py"]},
            {"diagnostics_signature": "d1"},
            {"test_signature": "t1"},
        ],
    )
    def test_change_detected(self, fields: dict[str, Any]) -> None:
        """Changed files or a new signature count as progress at the current step."""
        state = fold(done(2), done(3), seen(4, **fields))
        assert state.last_progress_step == 2
        assert state.consecutive_no_ops == 0

    @pytest.mark.parametrize("changed", [0, []])
    def test_no_change(self, changed: int | list[str]) -> None:
        """No changed files and the same signatures count as a no-op."""
        state = fold(seen(2, test_signature="t", diagnostics_signature="d"), done(3))
        state = PROJECTION.apply(
            state, seen(4, changed_files=changed, test_signature="t", diagnostics_signature="d")
        )
        assert state.consecutive_no_ops == 1
        assert state.last_progress_step == 0

    def test_signature_cleared_is_change(self) -> None:
        """A signature reported empty (tests now pass) differs from the previous one."""
        state = fold(seen(2, test_signature="t"), done(3), seen(4, test_signature=""))
        assert state.last_progress_step == 1
        assert state.consecutive_no_ops == 0
        assert state.same_error_count == 0

    def test_a_signal_not_observed_keeps_its_value(self) -> None:
        """An observation without a test signature keeps the last one and its count."""
        state = fold(observe(2, test_signature="t"), done(3), observe(4, changed_files=0))
        assert state.last_test_signature == "t"
        assert state.same_error_count == 1
        assert state.consecutive_no_ops == 1

    def test_split_observers_grow_both_counters(self) -> None:
        """A coder's no-change reports and a verifier's same failure each count, interleaved."""
        events: list[Event] = []
        for step in range(3):
            base = 2 + 4 * step
            events += [observe(base, changed_files=0), done(base + 1)]
            events += [observe(base + 2, test_signature="t"), done(base + 3)]
        state = fold(*events)
        assert state.same_error_count == 3
        assert state.consecutive_no_ops == 2  # the first failing test was news; then no change
        assert state.evaluate(ProgressPolicy.strict()).decision == "stuck"

    def test_functional_ok_not_observed_keeps_its_value(self) -> None:
        """A verifier's functional_ok survives a later coder observation that omits it."""
        state = fold(observe(2, functional_ok=True), observe(3, changed_files=0))
        assert state.functional_ok is True

    def test_last_progress_step_zero_without_change(self) -> None:
        """last_progress_step stays 0 when no observation showed a change."""
        state = fold(done(2), seen(3), done(4), seen(5))
        assert state.last_progress_step == 0
        assert state.consecutive_no_ops == 2

    def test_no_ops_reset_by_change(self) -> None:
        """consecutive_no_ops counts observations without change and resets on a change."""
        state = fold(seen(2), seen(3), seen(4))
        assert state.consecutive_no_ops == 3
        state = PROJECTION.fold([done(5), seen(6, changed_files=3), seen(7)], state)
        assert state.consecutive_no_ops == 1
        assert state.last_progress_step == 1

    def test_same_error_count(self) -> None:
        """same_error_count is 1 on a signature's first occurrence and grows while it repeats."""
        state = fold(seen(2, test_signature="a"))
        assert state.same_error_count == 1
        state = PROJECTION.fold([seen(3, test_signature="a"), seen(4, test_signature="a")], state)
        assert state.same_error_count == 3
        assert PROJECTION.apply(state, seen(5, test_signature="b")).same_error_count == 1

    def test_same_error_zero_when_nothing_fails(self) -> None:
        """same_error_count is 0 when the latest test report says nothing fails ("")."""
        state = fold(
            seen(2, test_signature="a"), seen(3, test_signature="a"), seen(4, test_signature="")
        )
        assert state.same_error_count == 0
        assert PROJECTION.apply(state, seen(5, test_signature="a")).same_error_count == 1

    def test_latest_observation_fields(self) -> None:
        """Signatures and functional_ok are the newest ones reported, signal by signal."""
        state = fold(
            seen(2, test_signature="t", diagnostics_signature="d", functional_ok=True),
            seen(3, diagnostics_signature="d2"),
        )
        assert state.last_test_signature == "t"
        assert state.last_diagnostics_signature == "d2"
        assert state.functional_ok is True

    def test_roundtrip(self) -> None:
        """Progress counters survive encode, strict JSON and decode."""
        state = fold(done(2), seen(3, test_signature="t", functional_ok=False), seen(4))
        state = PROJECTION.apply(state, seen(5, diagnostics_signature="d", functional_ok=True))
        assert roundtrip(state) == state
        assert roundtrip(fold()) == fold()

    def test_scope_is_run(self) -> None:
        """Persistent use keeps one state per run."""
        assert ProgressState.scope == "run"


STEP = st.sampled_from(["done", "done", "fail", "verdict", "start", "seen", "change", "many"])
"""One step of a history `ProgressState` folds in stretches: an outcome, a routed verdict
(attempt 0), an event no handler takes, an observation (cutting a stretch), 70 outcomes."""


def progress_history(steps: list[str]) -> list[Event]:
    """The events of `steps`, versions from 2."""
    events: list[Event] = []
    for kind in steps:
        for index in range(70 if kind == "many" else 1):
            version = len(events) + 2
            if kind == "fail" or (kind == "many" and index % 7 == 6):
                events.append(fail(version))
            elif kind == "verdict":
                events.append(StageCompleted(run_id=RID, version=version, stage="d", attempt=0))
            elif kind == "start":
                events.append(StageStarted(run_id=RID, version=version, stage="d", attempt=1))
            elif kind in ("seen", "change"):
                changed = [f"f{version}"] if kind == "change" else 0
                events.append(seen(version, changed_files=changed, test_signature="t"))
            else:
                events.append(done(version))
    return events


class TestStretchFold:
    @settings(max_examples=150, deadline=None)
    @given(st.lists(STEP, max_size=30), st.data())
    def test_a_fold_from_any_state_gives_what_apply_gives(
        self, steps: list[str], data: st.DataObject
    ) -> None:
        """From any state `apply` reached (or its JSON round trip), a fold of any stretch of
        the events after it (a list or an iterator) gives the counters `apply` gives event by
        event."""
        events = progress_history(steps)
        states = prefixes(PROJECTION, events)
        begin = data.draw(st.integers(0, len(events)), "begin")
        end = data.draw(st.integers(begin, len(events)), "end")
        for origin in (states[begin], roundtrip(states[begin])):
            for given_events in (events[begin:end], iter(events[begin:end])):
                folded = PROJECTION.fold(given_events, origin)
                assert folded == states[end]
                assert PROJECTION.encode(folded) == PROJECTION.encode(states[end])
        if end < len(events):  # the counters a fold made go on as `apply`'s do
            made = PROJECTION.fold(events[begin:end], states[begin])
            assert PROJECTION.fold(events[end:], made) == states[-1]

    def test_a_subclass_taking_outcomes_its_own_way_folds_them_its_way(self) -> None:
        """A subclass whose own handler (or `apply`) takes outcomes folds them with it, as
        `apply` event by event does, not with the counters' stretches."""
        events = progress_history(["many"] * 4)
        for projection in ignoring(ProgressState, StageFailed):
            assert projection.fold(events) == applied(projection, events)
            assert projection.fold(iter(events)).total_steps == 240


def loop(steps: int, no_ops: int, same_error: int, functional_ok: bool | None = None) -> Progress:
    return Progress(
        total_steps=steps,
        consecutive_no_ops=no_ops,
        same_error_count=same_error,
        last_test_signature="sig" if same_error else None,
        last_diagnostics_signature="diag",
        functional_ok=functional_ok,
    )


class TestEvaluate:
    def test_continue(self) -> None:
        """Below every limit the verdict is continue with an empty reason."""
        assert loop(49, 2, 2).evaluate(ProgressPolicy.strict()) == Verdict("continue", {})

    def test_all_limits_off(self) -> None:
        """With every limit None nothing fires however far the counters go."""
        assert loop(10**6, 10**6, 10**6).evaluate(OFF).decision == "continue"

    def test_max_steps(self) -> None:
        """total_steps reaching max_steps stops the run, with a full reason."""
        verdict = loop(50, 0, 0).evaluate(ProgressPolicy.strict())
        assert verdict == Verdict(
            "stuck",
            {
                "rule": "max_steps",
                "steps": 50,
                "consecutive_no_ops": 0,
                "same_error_count": 0,
                "last_test_signature": None,
                "last_diagnostics_signature": "diag",
                "limit": 50,
            },
        )

    def test_no_progress(self) -> None:
        """consecutive_no_ops reaching max_consecutive_no_ops fires the no_progress rule."""
        verdict = loop(5, 3, 0).evaluate(ProgressPolicy.strict())
        assert (verdict.decision, verdict.reason["rule"]) == ("stuck", "no_progress")
        assert (verdict.reason["limit"], verdict.reason["consecutive_no_ops"]) == (3, 3)

    def test_same_error(self) -> None:
        """same_error_count reaching max_same_error fires the same_error rule."""
        verdict = loop(5, 0, 3).evaluate(ProgressPolicy.strict())
        assert (verdict.decision, verdict.reason["rule"]) == ("stuck", "same_error")
        assert verdict.reason["last_test_signature"] == "sig"
        assert verdict.reason["limit"] == 3

    def test_rule_order(self) -> None:
        """When several rules fire, max_steps wins over no_progress, which wins over same_error."""
        policy = ProgressPolicy.strict()
        assert loop(50, 3, 3).evaluate(policy).reason["rule"] == "max_steps"
        assert loop(1, 3, 3).evaluate(policy).reason["rule"] == "no_progress"

    def test_disabled_rule_skipped(self) -> None:
        """A None limit turns its rule off while the others still apply."""
        policy = ProgressPolicy.strict(max_steps=None, max_consecutive_no_ops=None)
        assert loop(500, 50, 2).evaluate(policy).decision == "continue"
        assert loop(500, 50, 3).evaluate(policy).reason["rule"] == "same_error"

    def test_lenient_limits(self) -> None:
        """lenient allows what strict stops: 50 steps, 3 no-ops and 3 same errors."""
        assert loop(50, 3, 3).evaluate(ProgressPolicy.lenient()).decision == "continue"
        assert loop(99, 5, 4).evaluate(ProgressPolicy.lenient()).decision == "continue"
        assert loop(100, 0, 0).evaluate(ProgressPolicy.lenient()).reason["limit"] == 100

    def test_partial_under_lenient(self) -> None:
        """Under lenient a fired rule with functional_ok True is a partial success."""
        verdict = loop(1, 6, 0, functional_ok=True).evaluate(ProgressPolicy.lenient())
        assert (verdict.decision, verdict.reason["rule"]) == ("partial", "no_progress")

    @pytest.mark.parametrize("functional_ok", [False, None])
    def test_stuck_under_lenient_when_not_functional(self, functional_ok: bool | None) -> None:
        """Under lenient a fired rule without functional_ok True is stuck."""
        verdict = loop(1, 6, 0, functional_ok=functional_ok).evaluate(ProgressPolicy.lenient())
        assert verdict.decision == "stuck"

    def test_strict_never_partial(self) -> None:
        """Under strict a fired rule is stuck even when the last observation was functional."""
        verdict = loop(1, 3, 0, functional_ok=True).evaluate(ProgressPolicy.strict())
        assert verdict.decision == "stuck"

    def test_folded_no_progress_loop(self) -> None:
        """A folded loop without change ends partial under lenient and stuck under strict."""
        events: list[Event] = [seen(2, test_signature="t", functional_ok=True)]
        for version in range(3, 3 + 12, 2):
            events += [fail(version), seen(version + 1, test_signature="t", functional_ok=True)]
        state = fold(*events)
        assert state.consecutive_no_ops == 6
        assert state.evaluate(ProgressPolicy.strict()).reason["rule"] == "no_progress"
        assert state.evaluate(ProgressPolicy.strict()).decision == "stuck"
        assert state.evaluate(ProgressPolicy.lenient()).decision == "partial"


class TestVersionOneHistories:
    def test_a_v1_history_folds_as_it_did(self) -> None:
        """Stored v1 observations (every signal, None for none) give the verdicts v1 gave."""
        from events import decode

        def v1(version: int, **signals: Any) -> Event:
            state = {"timestamp": "2026-01-01T00:00:00+00:00", "changed_files": 0}
            state |= {"diagnostics_signature": None, "test_signature": None, "functional_ok": None}
            return decode(ProgressObserved.topic, {**state, **signals}, RID, version)

        no_ops = fold(v1(2), v1(3), v1(4))
        assert no_ops.consecutive_no_ops == 3
        assert no_ops.evaluate(ProgressPolicy.strict()).decision == "stuck"
        after = fold(v1(2, functional_ok=True), v1(3), v1(4), v1(5))
        assert after.functional_ok is False
        assert after.evaluate(ProgressPolicy.lenient(max_consecutive_no_ops=3)).decision == "stuck"
