from __future__ import annotations

import json
import uuid
from typing import Any

from events import Event, StageCompleted, StageFailed
from projections.failures import FailurePatterns, Failures
from projections.immutable import PMap

RID = uuid.UUID(int=3)
OTHER = uuid.UUID(int=4)
PROJECTION = FailurePatterns()


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
