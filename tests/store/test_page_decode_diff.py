"""Differential check: `decode_many` reads every state as `decode` of it alone does."""

from __future__ import annotations

import random
import uuid
from typing import Any

import attrs

from events.base import EVENT_TYPES
from events.codec import decode, decode_many, read_each
from events.errors import EventFormatError
from events.values import fields_of

_RUN = uuid.uuid4()
_POOL: list[Any] = [
    None, "x", "", 1, 0, 2.0, True, [], {}, [str(_RUN), 1], [str(_RUN)], str(_RUN),
    "2024-01-01T00:00:00+00:00", "2024-01-01", 5, {"a": 1}, float("inf"),
]  # fmt: skip


def _random_state(rng: random.Random, cls: type[Any], others: list[str], changes: int) -> Any:
    """A state of `cls` of random values, up to `changes` of its keys (or `others`, or the
    keys the event sets itself) dropped or given a random value."""
    names = sorted({f.name for f in attrs.fields(cls)} - {"run_id", "version"})
    state: dict[str, Any] = {n: rng.choice(_POOL) for n in names}
    state["timestamp"] = rng.choice(["2024-01-01T00:00:00+00:00", "bad", 3])
    version = rng.choice([None, cls.class_version, 1, 2, 3, 2.0, True, "2"])
    if version is not None:
        state["class_version"] = version
    for key in rng.sample([*state, "run_id", "version", *others], rng.randint(0, changes)):
        if key in state and rng.random() < 0.7:
            del state[key]
        else:
            state[key] = rng.choice(_POOL)
    return state


def _outcome(call: Any) -> Any:
    try:
        event = call()
    except Exception as error:
        return ("raised", type(error).__name__, str(error))
    if type(event) is tuple:  # `_alone`'s mark
        return event
    return (type(event), [(k, type(v), repr(v)) for k, v in fields_of(event).items()])


class TestDecodeManyDifferential:
    def test_random_states_read_as_alone(self) -> None:
        """Random states of every registered class decode (or fail) in a page as alone."""
        rng = random.Random(7)
        mismatches = []
        for topic, cls in sorted(EVENT_TYPES.items()):
            for _ in range(400):
                state = _random_state(rng, cls, ["extra"], 2)
                alone = _outcome(lambda s=dict(state), t=topic: decode(t, s, _RUN, 3))
                paged = _outcome(lambda s=dict(state), t=topic: decode_many([(t, s, 3)], _RUN)[0])
                if alone != paged:
                    mismatches.append((topic, state, alone, paged))
        assert not mismatches, mismatches[:3]


class TestReadEachDifferential:
    def test_random_states_read_as_a_page_then_alone(self) -> None:
        """Random states of every registered class, with the store's key or not, are read by
        `read_each` as `decode` of each alone reads it, `alone` taking those it refuses."""
        rng = random.Random(11)
        rows: list[tuple[Any, ...]] = []
        states: list[Any] = []
        expected: list[Any] = []
        for topic, cls in sorted(EVENT_TYPES.items()):
            for _ in range(300):
                state = _random_state(rng, cls, ["extra", "_c"], 3)
                row = (len(rows) + 1, topic, b"")
                copy = dict(state)
                rows.append(row)
                states.append(state)
                expected.append(_outcome(lambda s=copy, r=row: _page_or_alone(r, s)))
        read = iter(read_each(rows, states, _RUN, "_c", _alone))
        got = [_outcome(lambda: next(read)) for _ in rows]
        mismatches = [(row, e, g) for row, e, g in zip(rows, expected, got, strict=True) if e != g]
        assert not mismatches, mismatches[:3]


def _alone(run_id: uuid.UUID, row: tuple[Any, ...]) -> Any:
    """What a stream's `alone` gives for a row its page cannot read: here, a mark of it."""
    return ("alone", row[0])


def _page_or_alone(row: tuple[Any, ...], state: Any) -> Any:
    """The event the general decoder (`decode`) reads from `state` without the store's key,
    else `_alone`'s answer: the reference the generated readers are checked against."""
    if type(state) is dict:
        state.pop("_c", None)
    try:
        return decode(row[1], state, _RUN, row[0])
    except EventFormatError:
        return _alone(_RUN, row)
