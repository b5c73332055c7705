"""events.recording: which classes are made by `init_function`, and that each keeps to it."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import attrs
import pytest

from events import EVENT_TYPES, Event, StageCompleted
from events.recording import BUILT_IN_EVENTS, constructor
from events.values import init_function

RUN = uuid4()
WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
_DOES_MORE = (
    "def __init__",
    "cache_hash",
    "validator",
    "__attrs_pre_init__",
    "__attrs_post_init__",
)
"""What, written in an event class or a base of it in events/, would make its ``__init__``
more than `init_function` replicates."""


def _own_classes() -> set[type[Event]]:
    return {cls for cls in EVENT_TYPES.values() if cls.__module__.startswith("events.")}


class TestBuiltInEvents:
    def test_every_event_class_of_stagetrail_is_declared(self) -> None:
        """The declared set is exactly the event classes events/ defines."""
        assert _own_classes() == BUILT_IN_EVENTS
        assert len(BUILT_IN_EVENTS) == 21

    @pytest.mark.parametrize("cls", sorted(BUILT_IN_EVENTS, key=repr))
    def test_each_keeps_to_the_init_attrs_generates(self, cls: type[Event]) -> None:
        """Each field is a plain keyword of ``__init__`` (no validator, rename or factory of
        the instance), the class no hook, and its source and its bases' no ``__init__`` of
        their own, no cache_hash or validator: what `init_function` replicates."""
        fields = attrs.fields(cls)
        for field in fields:
            assert field.init, (cls, field.name)
            assert field.alias == field.name, (cls, field.name)
            assert field.validator is None, (cls, field.name)
            default: Any = field.default
            assert not (isinstance(default, attrs.Factory) and default.takes_self), field.name  # type: ignore[arg-type]
        assert not [hook for hook in _DOES_MORE[3:] if hasattr(cls, hook)]
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert [(p.name, p.kind) for p in parameters] == [
            (field.name, inspect.Parameter.KEYWORD_ONLY) for field in fields
        ]
        for own in (base for base in cls.__mro__ if base.__module__.startswith("events.")):
            source = inspect.getsource(own)
            assert not [word for word in _DOES_MORE if word in source], own
        assert init_function(cls) is not cls


class TestConstructor:
    def test_a_built_in_class_is_made_by_its_init_function(self) -> None:
        """One of stagetrail's own classes is made by `init_function`, giving its event."""
        made = constructor(StageCompleted)
        assert made is init_function(StageCompleted)
        fields: dict[str, Any] = {"run_id": RUN, "version": 1, "timestamp": WHEN}
        assert made(**fields, stage="s", attempt=1) == StageCompleted(
            **fields, stage="s", attempt=1
        )

    def test_a_users_event_kind_is_its_own_class(self) -> None:
        """A user's event kind (plain, hashed once, or with an ``__init__`` of its own) is
        called as it is: nothing of attrs' internals is assumed of it."""
        before = dict(EVENT_TYPES)
        try:

            @attrs.frozen(kw_only=True)
            class Plain(Event):
                topic = "user:Plain"
                grade: int = 0

            @attrs.frozen(kw_only=True, cache_hash=True)
            class Hashed(Event):
                topic = "user:Hashed"
                grade: int = 0

            @attrs.frozen(kw_only=True, init=False)
            class OwnInit(Event):
                topic = "user:OwnInit"
                grade: int

                def __init__(self, *, grade: str, **fields: Any) -> None:
                    self.__attrs_init__(grade=int(grade), **fields)

            for kind in (Plain, Hashed, OwnInit):
                assert constructor(kind) is kind
            fields: dict[str, Any] = {"run_id": RUN, "version": 1, "timestamp": WHEN}
            assert hash(constructor(Hashed)(**fields)) == hash(Hashed(**fields))
            assert constructor(OwnInit)(**fields, grade="2").grade == 2
        finally:
            for topic in set(EVENT_TYPES) - set(before):
                del EVENT_TYPES[topic]
