"""strict_json against the version it replaced: random JSON-ish values, good and bad."""

from __future__ import annotations

import enum
import math
import uuid
from collections import OrderedDict
from datetime import UTC, date, datetime, time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import InvalidPayload, NoteAdded
from events._strict_json import strict_json
from tests.events.test_events import make

# --- the oracle: strict_json as it was before the write path's rework (main at 519125c) ---

_SCALARS = frozenset({str, int, bool, type(None)})


class _NotJSON(Exception):
    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.steps: list[str] = []


def _before(field: str, value: object) -> Any:
    if type(value) in _SCALARS:
        return value
    try:
        return _copy(value)
    except _NotJSON as bad:
        raise InvalidPayload(field, field + "".join(reversed(bad.steps)), bad.problem) from None
    except RecursionError:
        raise InvalidPayload(field, field, "is nested too deeply (or contains itself)") from None


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        if value - value == 0.0:
            return value
        raise _NotJSON(f"is {value}, which is not JSON")
    if kind is dict:
        return _copy_dict(value)
    if kind is list or kind is tuple:
        return _copy_list(value)
    return _subclass(value)


def _copy_list(items: Any) -> Any:
    copied: list[Any] = []
    for item in items:
        kind = type(item)
        if kind in _SCALARS or (kind is float and item - item == 0.0):
            copied.append(item)
            continue
        try:
            copied.append(_copy(item))
        except _NotJSON as bad:
            bad.steps.append(f"[{len(copied)}]")
            raise
    return copied


def _subclass(value: object) -> Any:
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return _copy(float.__float__(value))
    if isinstance(value, dict):
        return _copy_dict(value)
    if isinstance(value, list | tuple):
        return _copy(list(value))
    raise _NotJSON(f"is a {type(value).__name__}, which is not JSON")


def _copy_dict(value: Any) -> Any:
    copied = {}
    for key, item in value.items():
        if type(key) is not str:
            key = _key(key)
        kind = type(item)
        if kind in _SCALARS or (kind is float and item - item == 0.0):
            copied[key] = item
            continue
        try:
            copied[key] = _copy(item)
        except _NotJSON as bad:
            bad.steps.append(f"[{key!r}]")
            raise
    return copied


def _key(key: object) -> str:
    if isinstance(key, str):
        return str.__str__(key)
    raise _NotJSON(f"has a {type(key).__name__} key {key!r}; JSON keys are str")


# --- random values ---


class _Text(str):
    """A str subclass."""


class _Whole(int):
    """An int subclass."""


class _Real(float):
    """A float subclass (may hold NaN)."""


class _Level(enum.IntEnum):
    LOW = 1


class _Colour(enum.StrEnum):
    RED = "red"


class _Items(dict):  # type: ignore[type-arg]
    """A dict subclass whose items() is not its storage (as json.dumps reads it)."""

    def items(self) -> Any:
        return [(key, [item]) for key, item in dict.items(self)]

    def __repr__(self) -> str:
        return f"_Items({dict.__repr__(self)})"


class _Lookup(dict):  # type: ignore[type-arg]
    """A dict subclass with its own iteration and lookup."""

    def __iter__(self) -> Any:
        return iter(list(dict.keys(self)))

    def __getitem__(self, key: Any) -> Any:
        return "looked up"

    def __repr__(self) -> str:
        return f"_Lookup({dict.__repr__(self)})"


class _Sequence(list):  # type: ignore[type-arg]
    """A list subclass."""


class _Odd:
    """Equal to everything, one hash: not JSON."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "_Odd()"


_ODD = _Odd()


class _Matching(enum.Enum):
    """A plain Enum member equal to its value: not JSON (orjson would write its value)."""

    ONE = 1

    def __eq__(self, other: object) -> bool:
        return bool(other == self.value)

    def __hash__(self) -> int:
        return hash(self.value)


class _FloatValued(int, enum.Enum):
    """An int member whose value is a float equal to it: its int is what is stored."""

    THREE = 3

    def __new__(cls, number: int) -> _FloatValued:
        member = int.__new__(cls, number)
        member._value_ = float(number)
        return member

    def __repr__(self) -> str:  # enum's own reads the value as an int
        return f"{type(self).__name__}.{self.name}"


class _BoolValued(int, enum.Enum):
    """An int member whose value is a bool equal to it: its int is what is stored."""

    ONE = 1

    def __new__(cls, number: int) -> _BoolValued:
        member = int.__new__(cls, number)
        member._value_ = bool(number)
        return member

    def __repr__(self) -> str:  # enum's own reads the value as an int
        return f"{type(self).__name__}.{self.name}"


_CORNERS = [
    _Matching.ONE,
    _FloatValued.THREE,
    _BoolValued.ONE,
    uuid.UUID(int=1),
    datetime(2020, 1, 1, tzinfo=UTC),
    date(2020, 1, 1),
    time(1),
    -0.0,
    2**64 - 1,
    2**64,
    (1, 2),
]
"""Values a JSON library writes its own way (an Enum member as its value, a UUID or a time
as a str, a tuple as a list): each must give exactly what the walk gives."""

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.text(max_size=4).map(_Text),
    st.integers().map(_Whole),
    st.floats().map(_Real),
    st.sampled_from([_Level.LOW, _Colour.RED, b"x", bytearray(b"y"), _ODD, 1j, {1}]),
    st.sampled_from(_CORNERS),
)
keys = st.one_of(
    st.text(max_size=3),
    st.text(max_size=3).map(_Text),
    st.sampled_from([_Colour.RED, 1, None, True, 2.5, (1,), _ODD]),
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    lists = st.lists(children, max_size=4)
    dicts = st.dictionaries(keys, children, max_size=4)
    return st.one_of(
        lists,
        lists.map(tuple),
        lists.map(_Sequence),
        dicts,
        dicts.map(OrderedDict),
        dicts.map(_Items),
        dicts.map(_Lookup),
    )


values = st.recursive(scalars, _containers, max_leaves=20)


def _long_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Containers of 8 or more items (where a whole-container fast path would start)."""
    lists = st.lists(children, min_size=8, max_size=10)
    dicts = st.dictionaries(st.text(max_size=3), children, min_size=8, max_size=10)
    return st.one_of(lists, dicts, _containers(children))


plain = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
)
long_values = st.recursive(st.one_of(plain, scalars), _long_containers, max_leaves=60)


def _outcome(convert: Any, value: object) -> tuple[str, Any]:
    try:
        return "value", _typed(convert(value))
    except InvalidPayload as error:
        return "error", (type(error), str(error))


def _typed(value: Any) -> Any:
    """`value` with each part's exact type beside it: 1 and True, 1.0 and 1 differ."""
    if type(value) is dict:
        return ("dict", [(_typed(key), _typed(item)) for key, item in value.items()])
    if type(value) is list:
        return ("list", [_typed(item) for item in value])
    return (type(value), value if not (type(value) is float and math.isnan(value)) else "nan")


class TestAgainstTheReplacedVersion:
    @settings(max_examples=600, deadline=None)
    @given(values)
    def test_the_same_value_or_the_same_error(self, value: Any) -> None:
        """Any value gives the copy the replaced strict_json gave, or its error word for word."""
        assert _outcome(lambda v: strict_json("result", v), value) == _outcome(
            lambda v: _before("result", v), value
        )

    @settings(max_examples=400, deadline=None)
    @given(long_values)
    def test_long_containers_give_the_same_value_or_the_same_error(self, value: Any) -> None:
        """Containers of 8 or more items come out as before."""
        assert _outcome(lambda v: strict_json("result", v), value) == _outcome(
            lambda v: _before("result", v), value
        )

    @settings(max_examples=300, deadline=None)
    @given(values)
    def test_an_event_field_holds_what_the_replaced_version_gave(self, value: Any) -> None:
        """A payload field (its scalar shortcut included) stores or refuses as before."""
        assert _outcome(lambda v: make(NoteAdded, value=v).value, value) == _outcome(  # type: ignore[attr-defined]
            lambda v: _before("value", v), value
        )

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(values, long_values))
    def test_the_copy_shares_no_container_with_the_input(self, value: Any) -> None:
        """No list or dict of the stored copy is one of the caller's."""
        try:
            copied = strict_json("result", value)
        except InvalidPayload:
            return
        theirs = set(map(id, _containers_in(value)))
        assert not [part for part in _containers_in(copied) if id(part) in theirs]


class TestCorners:
    @pytest.mark.parametrize("odd", _CORNERS, ids=repr)
    def test_an_odd_item_deep_in_a_long_container_gives_the_walks_result(self, odd: Any) -> None:
        """An odd item in, or nested in, a list or dict of 8+ plain items gives the replaced
        version's copy (same types: an int enum member's int, not its float or bool value) or
        its error (a plain Enum member equal to its value is refused)."""
        row = list(range(8))
        for value in (
            [*row, odd],
            [*row, [odd]],
            {str(index): index for index in row} | {"odd": odd},
            {str(index): [index] for index in row} | {"odd": {"in": odd}},
        ):
            assert _outcome(lambda v: strict_json("result", v), value) == _outcome(
                lambda v: _before("result", v), value
            )


def _containers_in(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [value, *(part for item in dict.values(value) for part in _containers_in(item))]
    if isinstance(value, list | tuple):
        return [value, *(part for item in value for part in _containers_in(item))]
    return []
