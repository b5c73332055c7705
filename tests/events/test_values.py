"""Trusted values built without __init__: slotted, equal to what the constructor makes."""

from __future__ import annotations

import copy
import gc
import importlib
import pickle
import pkgutil
import sys
import weakref
from datetime import UTC, datetime
from functools import partial
from typing import Any, ClassVar
from uuid import uuid4

import attrs
import pytest
from freezegun import freeze_time
from hypothesis import given, settings
from hypothesis import strategies as st

import projections
from events import EVENT_TYPES, Event, StageCompleted
from events.codec import encode, read_each
from events.recording import BUILT_IN_EVENTS
from events.values import (
    build,
    evolve,
    fields_of,
    init_function,
    maker,
    slot_setters,
    writable_twin,
)
from projections import Attempt, Frame, Results, Retries, Round, Rounds, RunSummary, Stack

RUN = uuid4()
WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def completed() -> StageCompleted:
    return StageCompleted(
        run_id=RUN, version=2, timestamp=WHEN, stage="work", attempt=1, result={"a": [1]}
    )


@attrs.define(slots=False)
class Loose:
    """A class keeping its attributes in a __dict__."""

    x: int


class TestValues:
    def test_build_makes_what_the_constructor_makes(self) -> None:
        """A value built from its fields equals and prints as the constructed one."""
        made = completed()
        built = build(StageCompleted, fields_of(made))
        assert built == made
        assert repr(built) == repr(made)

    def test_evolve_changes_only_the_fields_given(self) -> None:
        """An evolved copy holds the changes and every other field of the original."""
        made = completed()
        changed = evolve(made, attempt=2, outcome="retry")
        assert changed == attrs.evolve(made, attempt=2, outcome="retry")
        assert made.attempt == 1

    def test_fields_of_lists_every_attribute_in_order(self) -> None:
        """The fields come back by name in their declared order, as a new dict."""
        made = completed()
        fields = fields_of(made)
        assert list(fields) == [field.name for field in attrs.fields(StageCompleted)]
        fields["stage"] = "other"
        assert made.stage == "work"

    def test_every_event_and_state_value_is_slotted(self) -> None:
        """No event class (nor a run summary) keeps a __dict__ per instance."""
        for cls in [*EVENT_TYPES.values(), RunSummary]:
            assert "__slots__" in cls.__dict__, cls
        assert not hasattr(completed(), "__dict__")
        assert sys.getsizeof(completed()) < 200

    def test_a_built_event_pickles(self) -> None:
        """A value built without __init__ crosses process boundaries like any other."""
        built = build(StageCompleted, fields_of(completed()))
        assert pickle.loads(pickle.dumps(built)) == built

    def test_a_class_without_slots_is_refused(self) -> None:
        """Building a __dict__ class names the class and what to declare."""
        with pytest.raises(TypeError, match=r"Loose\.x is not a slot: declare"):
            build(Loose, {"x": 1})

    def test_slot_setters_set_each_attribute_in_declared_order(self) -> None:
        """`slot_setters` gives one setter per attribute, in declared order, that together
        build the value the constructor builds; a __dict__ class is refused by name."""
        made = completed()
        setters = slot_setters(StageCompleted)
        assert list(setters) == [field.name for field in attrs.fields(StageCompleted)]
        value = object.__new__(StageCompleted)
        for name, set_slot in setters.items():
            set_slot(value, getattr(made, name))
        assert value == made
        with pytest.raises(TypeError, match=r"Loose\.x is not a slot: declare"):
            slot_setters(Loose)

    def test_a_missing_field_raises(self) -> None:
        """A build without one of the fields fails instead of leaving the slot empty."""
        fields = fields_of(completed())
        del fields["stage"]
        with pytest.raises(KeyError, match="stage"):
            build(StageCompleted, fields)


@attrs.frozen
class Clashing:
    """A class whose field names are those the generated functions use themselves."""

    v: int
    new: int
    cls: int
    set_v: int


class TestMaker:
    @pytest.mark.parametrize(
        "cls", [Attempt, Results, Retries, Round, Rounds, RunSummary, Frame, Stack]
    )
    def test_the_classes_made_so_check_nothing_it_would_skip(self, cls: type) -> None:
        """The built-in values a fold makes by `maker` have no converter, validator or post-init
        (which it would skip): adding one makes this fail, not pass silently."""
        assert not hasattr(cls, "__attrs_post_init__")
        for field in attrs.fields(cls):
            assert field.converter is None, (cls, field.name)
            assert field.validator is None, (cls, field.name)

    def test_a_value_made_by_position_or_name_is_the_constructed_one(self) -> None:
        """`maker` takes the fields in declared order, or by name, and builds the same value."""
        made = completed()
        make = maker(StageCompleted)
        assert make(*fields_of(made).values()) == made
        assert make(**fields_of(made)) == made
        assert repr(make(**fields_of(made))) == repr(made)

    def test_field_names_cannot_shadow_what_it_calls(self) -> None:
        """Fields named like the generated code's own names are set, not called."""
        assert maker(Clashing)(1, 2, 3, 4) == Clashing(v=1, new=2, cls=3, set_v=4)

    def test_a_missing_field_raises(self) -> None:
        """A call without one of the fields fails instead of leaving the slot empty."""
        fields = fields_of(completed())
        del fields["stage"]
        with pytest.raises(TypeError, match="stage"):
            maker(StageCompleted)(**fields)


class Hooked:
    """A base whose subclass hook keeps a list of its subclasses (a registry of its own)."""

    __slots__ = ()
    seen: list[type] = []

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        Hooked.seen.append(cls)


@attrs.frozen
class UnderHook(Hooked):
    """A frozen value under a base with a hook that would count a twin."""

    x: int


VALUE_CLASSES = [Attempt, Results, Retries, Round, Rounds, RunSummary, Frame, Stack]


class TestWritableTwin:
    def test_every_event_and_value_class_is_built_as_its_slots_would_set_it(self) -> None:
        """Every registered event class and built-in value, built through its writable twin
        (where it has one), is an instance of the class holding the very objects its slot
        setters would set."""
        registered = dict(EVENT_TYPES)
        cls: type[Any]
        for cls in [*registered.values(), *VALUE_CLASSES]:
            # an event class has one; a class adding its own weakref slot has none (Python
            # finds the layouts differ), and is built through its slot setters instead
            if cls in registered.values():
                assert writable_twin(cls) is not None, cls
            fields = {field.name: object() for field in attrs.fields(cls)}
            expected: Any = object.__new__(cls)
            for name, set_slot in slot_setters(cls).items():
                set_slot(expected, fields[name])
            built: Any
            for built in (build(cls, fields), maker(cls)(**fields)):
                assert type(built) is cls
                assert all(getattr(built, n) is v for n, v in fields.items()), cls
                assert fields_of(built) == fields_of(expected)
            evolved: Any = evolve(build(cls, fields), **{next(iter(fields)): 5})
            assert type(evolved) is cls
            assert getattr(evolved, next(iter(fields))) == 5
        assert registered == EVENT_TYPES  # no twin registered as an event class

    def test_a_value_built_through_the_twin_stays_frozen(self) -> None:
        """The value a twin was filled as refuses assignment, as a constructed one does."""
        built = build(StageCompleted, fields_of(completed()))
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            built.stage = "other"  # type: ignore[misc]
        assert built == completed()

    def test_a_base_with_a_foreign_hook_or_no_slots_gives_no_twin(self) -> None:
        """A base whose subclass hook would see the twin, or a class without slots, has no twin;
        its values are still built, through the slot setters."""
        before = list(Hooked.seen)
        assert writable_twin(UnderHook) is None
        assert Hooked.seen == before
        assert maker(UnderHook)(x=3) == UnderHook(x=3)
        assert writable_twin(Loose) is None


class Registering(type):
    """A metaclass keeping a list of every class it makes (a registry of its own)."""

    made: list[str] = []

    def __init__(cls, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        Registering.made.append(cls.__qualname__)


class Registered(metaclass=Registering):
    """A base made by a registering metaclass, with the weakref slot its values would add."""

    __slots__ = ("__weakref__",)


@attrs.frozen
class UnderMetaclass(Registered):
    """A frozen value whose metaclass would register a twin made for it."""

    x: int


@attrs.frozen(weakref_slot=False)
class Finalized:
    """A frozen value whose finalizer reads its field (and notes it)."""

    x: int
    finalized: ClassVar[list[int]] = []

    def __del__(self) -> None:
        Finalized.finalized.append(getattr(self, "x", -1))


class Counting:
    """A slotted base with a `__new__` of its own, counting the values made."""

    __slots__ = ()
    made = 0

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        Counting.made += 1
        return super().__new__(cls)


@attrs.frozen(weakref_slot=False)
class UnderNew(Counting):
    """A frozen value whose base runs its own `__new__`."""

    x: int


class TestTwinGuards:
    def test_a_base_with_its_own_new_gets_no_twin(self) -> None:
        """A class whose base has a `__new__` of its own has no twin (made by calling it, the
        twin would run that `__new__`); its values are built all the same, through the slot
        setters, and no `__new__` of the base runs for them."""
        assert writable_twin(UnderNew) is None
        before = Counting.made
        assert maker(UnderNew)(x=3) == UnderNew(x=3)
        assert Counting.made == before + 1  # the constructor's own, not the maker's

    def test_a_class_of_its_own_metaclass_gets_no_twin(self) -> None:
        """A class whose metaclass is not `type` has no twin, so the metaclass makes (and
        registers) no class beside the user's; its values are built all the same."""
        before = list(Registering.made)
        assert writable_twin(UnderMetaclass) is None
        assert Registering.made == before
        assert maker(UnderMetaclass)(x=3) == UnderMetaclass(x=3)

    def test_finding_a_twin_finalizes_no_empty_value(self) -> None:
        """Trying the twin leaves no empty value of the class to its finalizer (which would
        find its field unset); a value built through the twin is finalized as usual."""
        assert writable_twin(Finalized) is not None
        gc.collect()
        assert Finalized.finalized == []
        value = build(Finalized, {"x": 4})
        del value
        gc.collect()
        assert Finalized.finalized == [4]


PAYLOADS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=3),
    st.tuples(st.integers(), st.text(max_size=2)),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


def _value_classes() -> list[type[Any]]:
    """Every registered event class and every slotted attrs class of the projections."""
    found: dict[type[Any], None] = dict.fromkeys(EVENT_TYPES.values())
    for module_info in pkgutil.walk_packages(projections.__path__, "projections."):
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if isinstance(value, type) and attrs.has(value) and "__slots__" in value.__dict__:
                found.setdefault(value)
    return list(found)


def _outcome(call: Any) -> Any:
    """What `call` gives (as its type and repr) or raises (as its type and message)."""
    try:
        result = call()
    except Exception as error:
        return ("raised", type(error).__name__, str(error))
    return ("gave", type(result), repr(result))


def _behaviour(value: Any) -> list[Any]:
    """How `value` answers what users ask of a value: equality is checked beside this."""
    return [
        type(value),
        repr(value),
        _outcome(lambda: hash(value)),
        _outcome(lambda: pickle.loads(pickle.dumps(value))),
        _outcome(lambda: copy.copy(value)),
        _outcome(lambda: copy.deepcopy(value)),
        _outcome(lambda: attrs.asdict(value, recurse=False)),
        _outcome(lambda: attrs.evolve(value)),
        _outcome(lambda: setattr(value, attrs.fields(type(value))[0].name, 1)),
        _outcome(lambda: weakref.ref(value) and None),
        hasattr(value, "__dict__"),
        sys.getsizeof(value),
        gc.is_tracked(value),
    ]


class TestTwinDifferential:
    @settings(max_examples=40, deadline=None)
    @given(st.data())
    def test_twin_built_values_behave_as_slot_set_ones(self, data: st.DataObject) -> None:
        """Random values of every event and projection value class, built through the writable
        twin (`build`, `maker`, `evolve`), equal, hash, print, pickle, copy, evolve and refuse
        assignment exactly as the same values set slot by slot do."""
        registered = dict(EVENT_TYPES)
        for cls in _value_classes():
            names = [field.name for field in attrs.fields(cls)]
            fields = {name: data.draw(PAYLOADS, label=f"{cls.__name__}.{name}") for name in names}
            expected: Any = object.__new__(cls)
            for name, set_slot in slot_setters(cls).items():
                set_slot(expected, fields[name])
            wanted = _behaviour(expected)
            built: Any
            for built in (build(cls, fields), maker(cls)(**fields), evolve(expected, **fields)):
                assert built == expected, cls
                assert (built != expected) is False, cls
                assert all(getattr(built, name) is fields[name] for name in names), cls
                assert _behaviour(built) == wanted, cls
        assert registered == EVENT_TYPES

    def test_the_value_classes_without_a_weakref_slot_have_twins(self) -> None:
        """Each event class, and each projection value declared without a weakref slot of its
        own, is built through a twin (the speed the declaration is there for)."""
        for cls in _value_classes():
            if cls in EVENT_TYPES.values() or "__weakref__" not in cls.__slots__:
                assert writable_twin(cls) is not None, cls


class TestUserEventClasses:
    def test_a_users_event_classes_read_back_as_constructed(self) -> None:
        """Event classes a user writes (slotted, under a subclass hook of their own, without
        slots of their own) are registered once, and their stored states read back through
        `read_each` as the events constructed, with a twin or without; no twin registered."""
        before = dict(EVENT_TYPES)
        try:

            @attrs.frozen(kw_only=True)
            class Reviewed(Event):
                topic = "user:Reviewed"
                grade: int = 0

            class Auditing(Event):
                topic = "user:Auditing"
                seen: ClassVar[list[str]] = []

                def __init_subclass__(cls, **kwargs: Any) -> None:
                    super().__init_subclass__(**kwargs)
                    Auditing.seen.append(cls.__qualname__)

            @attrs.frozen(kw_only=True)
            class Graded(Auditing):
                topic = "user:Graded"
                grade: int = 0

            class Plain(StageCompleted):
                topic = "user:Plain"

            made: list[Event] = [
                Reviewed(run_id=RUN, version=1, timestamp=WHEN, grade=3),
                Graded(run_id=RUN, version=2, timestamp=WHEN, grade=4),
                Plain(run_id=RUN, version=3, timestamp=WHEN, stage="s", attempt=1),
            ]
            seen = list(Auditing.seen)
            rows = [(event.version, event.topic) for event in made]
            states = [encode(event)[1] for event in made]
            read = list(read_each(rows, states, RUN, "_c", None))
            assert read == made
            assert [type(event) for event in read] == [type(event) for event in made]
            assert [writable_twin(type(e)) is None for e in made] == [False, True, True]
            assert Auditing.seen == seen
            assert set(EVENT_TYPES) - set(before) == {e.topic for e in made} | {"user:Auditing"}
            assert EVENT_TYPES["user:Graded"] is Graded
        finally:
            for topic in set(EVENT_TYPES) - set(before):
                del EVENT_TYPES[topic]


class TestInitFunction:
    @settings(max_examples=40, deadline=None)
    @given(st.data())
    def test_each_built_in_event_class_made_as_its_init_makes_it_or_refused_alike(
        self, data: st.DataObject
    ) -> None:
        """Random field values (good and bad) give each of stagetrail's own event classes'
        `init_function` the event its own ``__init__`` gives, behaving alike (its hash
        too), or the same error word for word."""
        for cls in sorted(BUILT_IN_EVENTS, key=lambda cls: cls.__name__):
            made = init_function(cls)
            assert made is not cls, cls
            names = [field.name for field in attrs.fields(cls)]
            chosen: dict[str, Any] = {"run_id": RUN, "version": 1, "timestamp": WHEN}
            chosen |= {  # the time given: a default of now would differ between the two
                name: data.draw(st.one_of(PAYLOADS, st.just(RUN)), label=name)
                for name in names
                if name != "timestamp" and data.draw(st.booleans(), label=f"give {name}")
            }
            expected, built = _outcome(partial(cls, **chosen)), _outcome(partial(made, **chosen))
            assert built == expected, cls
            if expected[0] == "gave":
                assert made(**chosen) == cls(**chosen), cls
                assert _behaviour(made(**chosen)) == _behaviour(cls(**chosen)), cls

    def test_a_class_whose_init_does_more_by_attrs_api_is_itself(self) -> None:
        """A validator, a post-init hook or a factory taking the instance (what attrs' public
        API shows): the class itself."""

        @attrs.frozen(kw_only=True)
        class Validated:
            grade: int = attrs.field(validator=attrs.validators.instance_of(int))

        @attrs.frozen(kw_only=True)
        class Hooked:
            grade: int = 0

            def __attrs_post_init__(self) -> None:
                """Runs after the fields are set."""

        @attrs.frozen(kw_only=True)
        class SelfMade:
            grade: int = attrs.field(default=attrs.Factory(lambda self: 1, takes_self=True))

        for cls in (Validated, Hooked, SelfMade):
            assert init_function(cls) is cls

    def test_its_errors_name_the_class_as_init_does(self) -> None:
        """A missing or unknown keyword reads as the class's ``__init__`` says it."""
        made = init_function(StageCompleted)
        for chosen in ({"run_id": RUN, "version": 1}, {"surprise": 1}):
            assert _outcome(partial(made, **chosen)) == _outcome(partial(StageCompleted, **chosen))

    def test_a_default_made_by_a_factory_is_made_for_each_value(self) -> None:
        """The time left out is the factory's (now), as the class's ``__init__`` makes it."""
        made = init_function(StageCompleted)
        fields: dict[str, Any] = {"run_id": RUN, "version": 1, "stage": "s"}
        with freeze_time(WHEN):
            assert made(**fields, attempt=1) == StageCompleted(**fields, attempt=1)
            assert made(**fields, attempt=1).timestamp == WHEN
