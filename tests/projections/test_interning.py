from __future__ import annotations

import uuid
from typing import Any

import pytest

from events import StageCompleted, StageFailed
from events.codec import decode, encode
from projections import RoundsTable, StageResults, StateStack
from projections.interning import interned

RID = uuid.UUID(int=11)


def stored(event: Any, **odd: Any) -> Any:
    """`event` as a store would give it back with the `odd` values written in its row."""
    topic, state = encode(event)
    state.update(odd)
    return decode(topic, state, RID, event.version)


class TestInterned:
    def test_a_plain_string_is_the_one_interned_copy(self) -> None:
        """Two equal strings built apart come back as one object."""
        first, second = "".join(["dev", "eloper"]), "".join(["devel", "oper"])
        assert first is not second
        assert interned(first) is interned(second)

    @pytest.mark.parametrize("value", [None, 3, b"x"], ids=["none", "int", "bytes"])
    def test_anything_else_is_returned_as_it_was(self, value: object) -> None:
        """A value that is not a plain str is returned untouched, never an intern error."""
        assert interned(value) is value


class TestOddStoredValues:
    @pytest.mark.parametrize("projection", [StateStack, StageResults, RoundsTable])
    def test_a_stored_null_outcome_folds(self, projection: Any) -> None:
        """A stored outcome of null (decoding trusts the store) folds as before interning."""
        event = stored(
            StageCompleted(run_id=RID, version=1, stage="work", attempt=1, result=None),
            outcome=None,
        )
        folded = projection().fold([event])
        assert folded == projection().fold([event])

    @pytest.mark.parametrize("projection", [StateStack, StageResults, RoundsTable])
    def test_a_stored_failure_without_error_text_folds(self, projection: Any) -> None:
        """A stored failure whose error and type are null folds, keeping them None."""
        failure = StageFailed(
            run_id=RID, version=1, stage="work", attempt=1, error="x", error_type="E"
        )
        event = stored(failure, error=None, error_type=None)
        assert projection().fold([event]) is not None
