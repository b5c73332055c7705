"""Building frozen, slotted attrs values from fields already checked, for the hot paths.

The one way stagetrail builds a frozen attrs value it trusts (decoding stored
events, folding a run's machine state, folding projections): without the
class's ``__init__``, whose converters copy and check every payload value again.
Each slot is set through its own descriptor, the way attrs' documentation says a
frozen instance may be written (``object.__setattr__``), by four small
functions made once per class: the three steps a long fold repeats per event
cost about twice a plain dict fill, and a slotted value takes a third of the memory.

Where it can, each function fills a *writable twin* of the class instead (`writable_twin`):
a class of the same slot layout whose attributes plain assignment sets, the value then
made an instance of the class by assigning its ``__class__`` (which Python allows between
classes of one layout). A plain assignment is a specialised store, where a descriptor's
``__set__`` is a call with its arguments packed: a value of eight fields costs ~2,400
instructions instead of ~6,400. The twin is made by calling it (``object``'s own
``__new__`` and ``__init__``, nothing of the class's): ~500 instructions fewer than
``object.__new__(twin)``, whose wrapper checks and slices its arguments each call.

A value not yet trusted (one of stagetrail's own events being recorded) is made by
`init_function`: the class's ``__init__`` as a function of the same checks, filling a twin
the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

T = TypeVar("T")

TWIN_OF = "__stagetrail_twin_of__"
"""The attribute a writable twin holds its class in: a class hook that registers subclasses
(`Event.__init_subclass__`) leaves a class holding it out."""

_BUILDERS: dict[type, Callable[[dict[str, Any]], Any]] = {}
_EVOLVERS: dict[type, Callable[[Any, dict[str, Any]], Any]] = {}
_READERS: dict[type, Callable[[Any], dict[str, Any]]] = {}
_MAKERS: dict[type, Callable[..., Any]] = {}
_TWINS: dict[type, type | None] = {}
_WELCOMING: set[type] = set()
"""Classes whose ``__init_subclass__`` leaves a writable twin out (`welcome_twins`)."""


def build(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the slotted attrs class `cls` holding `fields` (one per attribute).

    Raises:
        KeyError: `fields` lacks one of the class's attributes.
    """
    builder = _BUILDERS.get(cls) or _prepare(cls, _BUILDERS)
    return builder(fields)  # type: ignore[no-any-return]


def builder(cls: type[T]) -> Callable[[dict[str, Any]], T]:
    """`build` for one class, as a function to keep: a hot loop saves the lookup per call."""
    return _BUILDERS.get(cls) or _prepare(cls, _BUILDERS)


def maker(cls: type[T]) -> Callable[..., T]:
    """`build` for one class taking its attributes as arguments (by position in declared
    order, or by attribute name): no dict per value, for the handlers a long fold calls per
    event.

    Like `build`, it sets the attributes as given: attrs converters, validators, defaults
    and ``__attrs_post_init__`` do not run, so use it only for classes without them, with
    values already checked (the events a fold reads were checked when recorded).
    """
    return _MAKERS.get(cls) or _prepare(cls, _MAKERS)


def slot_setters(cls: type) -> dict[str, Callable[[Any, Any], None]]:
    """Each attribute's slot setter by name, in declared order: for code generated once per
    class that builds values as `maker` does, with no call of its own per value (a stream's
    per-class readers). The same rules as `maker`: nothing of ``__init__`` runs.

    Raises:
        TypeError: `cls` keeps its attributes in a ``__dict__`` (not ``slots=True``).
    """
    return {field.name: _slot(cls, field.name).__set__ for field in attrs.fields(cls)}


def welcome_twins(klass: type) -> None:
    """Declare that `klass`'s ``__init_subclass__`` leaves a class holding `TWIN_OF` be, so
    that its subclasses may have writable twins (a class with another hook has none)."""
    _WELCOMING.add(klass)


def writable_twin(cls: type) -> type | None:
    """A class of `cls`'s slot layout, its attributes set by plain assignment, whose instance
    (``twin()``: a bare one, no attribute set) becomes a `cls` by assigning it `cls` as its
    ``__class__``; None where there is none (not slotted, several bases, a metaclass other
    than `type`, a base whose subclass hook does not welcome twins, a base with a
    ``__new__`` of its own, or a layout Python does not find the same). Made once per class.

    Only for values built as `maker` builds them: nothing of ``__init__`` runs.
    """
    if cls in _TWINS:
        return _TWINS[cls]
    twin = _TWINS[cls] = _twin(cls)
    return twin


def _twin(cls: type) -> type | None:
    slots = cls.__dict__.get("__slots__")
    if slots is None or len(cls.__bases__) != 1 or type(cls) is not type:
        return None  # a metaclass of its own would see (and may register) the twin
    base = cls.__bases__[0]
    for klass in base.__mro__[:-1]:
        if "__init_subclass__" in vars(klass) and klass not in _WELCOMING:
            return None  # its hook would see the twin as one more subclass
    namespace = {
        "__slots__": slots,
        "__init__": object.__init__,  # `twin()` makes a bare value: nothing of attrs' init
        "__setattr__": object.__setattr__,  # the generic store: no frozen class's refusal
        "__delattr__": object.__delattr__,
        "__module__": cls.__module__,
        "__qualname__": f"{cls.__qualname__}(writable twin)",
        TWIN_OF: cls,
    }
    try:
        twin = type(cls)(cls.__name__, (base,), namespace)
        probe: Any = object.__new__(twin)
        probe.__class__ = cls
        object.__setattr__(probe, "__class__", twin)  # dropped as a twin: no `cls.__del__`
    except TypeError:  # a layout (or metaclass) Python does not let one become the other
        return None
    new: object = twin.__new__
    if new is not object.__new__:  # `twin()` would run a base's own `__new__`
        return None
    return twin


def evolve(value: T, /, **changes: Any) -> T:
    """A copy of `value` with `changes`, without __init__ (`attrs.evolve` runs it each call)."""
    cls = type(value)
    evolver = _EVOLVERS.get(cls) or _prepare(cls, _EVOLVERS)
    return evolver(value, changes)  # type: ignore[no-any-return]


def fields_of(value: Any) -> dict[str, Any]:
    """A new dict of `value`'s attributes by name, in their declared order."""
    cls = type(value)
    reader = _READERS.get(cls) or _prepare(cls, _READERS)
    return reader(value)


def _prepare(cls: type, table: dict[type, Any]) -> Any:
    """Make the class's four functions (once), and give back the one of `table`."""
    names = [field.name for field in attrs.fields(cls)]
    setters = {f"set_{name}": _slot(cls, name).__set__ for name in names}
    own = "_m_"
    while any(name.startswith(own) for name in names):
        own += "_"
    lines = [
        "def build(f):",
        "    v = new(cls)",
        *(f"    set_{name}(v, f[{name!r}])" for name in names),
        "    return v",
        "def evolve(old, c):",
        "    v = new(cls)",
        *(f"    set_{name}(v, c[{name!r}] if {name!r} in c else old.{name})" for name in names),
        "    return v",
        "def read(v):",
        "    return {" + ", ".join(f"{name!r}: v.{name}" for name in names) + "}",
        # Its parameters are the field names: its own names start with what none of them do.
        f"def make({', '.join(names)}):",
        f"    {own}v = {own}new({own}cls)",
        *(f"    {own}set_{name}({own}v, {name})" for name in names),
        f"    return {own}v",
    ]
    twin = writable_twin(cls)
    if twin is not None:
        lines = _twin_lines(names, own)
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls, "twin": twin, **setters}
    scope |= {f"{own}new": object.__new__, f"{own}cls": cls, f"{own}twin": twin}
    scope |= {f"{own}{setter}": descriptor for setter, descriptor in setters.items()}
    exec(compile("\n".join(lines), f"<values of {cls.__qualname__}>", "exec"), scope)
    _BUILDERS[cls], _EVOLVERS[cls], _READERS[cls] = scope["build"], scope["evolve"], scope["read"]
    _MAKERS[cls] = scope["make"]
    return table[cls]


def _twin_lines(names: list[str], own: str) -> list[str]:
    """`_prepare`'s four functions filling a writable twin (`writable_twin`), then made `cls`."""
    return [
        "def build(f):",
        "    v = twin()",
        *(f"    v.{name} = f[{name!r}]" for name in names),
        "    v.__class__ = cls",
        "    return v",
        "def evolve(old, c):",
        "    v = twin()",
        *(f"    v.{name} = c[{name!r}] if {name!r} in c else old.{name}" for name in names),
        "    v.__class__ = cls",
        "    return v",
        "def read(v):",
        "    return {" + ", ".join(f"{name!r}: v.{name}" for name in names) + "}",
        f"def make({', '.join(names)}):",
        f"    {own}v = {own}twin()",
        *(f"    {own}v.{name} = {name}" for name in names),
        f"    {own}v.__class__ = {own}cls",
        f"    return {own}v",
    ]


def _slot(cls: type, name: str) -> Any:
    """The descriptor of `name`'s slot.

    Raises:
        TypeError: `cls` keeps its attributes in a ``__dict__`` (not ``slots=True``).
    """
    for klass in cls.__mro__:
        slot = klass.__dict__.get(name)
        if slot is not None and hasattr(slot, "__set__"):
            return slot
    raise TypeError(f"{cls.__qualname__}.{name} is not a slot: declare the class slots=True")


def init_function(cls: type[T]) -> Callable[..., T]:
    """`cls`'s ``__init__`` as a function making the value, filling a writable twin: each
    field through the same converter (the same checks and errors), default and factory, the
    same keyword parameters; no frozen ``__setattr__`` call per field.

    Only for a class known to keep to what this replicates (stagetrail's own event classes,
    `events.recording.BUILT_IN_EVENTS`, pinned by a test): the ``__init__`` attrs generates
    from its fields, no ``cache_hash``, no validator or pre- or post-init hook. What
    attrs' public API shows otherwise (a validator, a hook, a field outside ``__init__`` or
    renamed, a factory taking the instance, no twin) gives `cls` itself.
    """
    made = _INIT_FUNCTIONS.get(cls)
    if made is None:
        made = _INIT_FUNCTIONS[cls] = _init_function(cls)
    return made


_INIT_FUNCTIONS: dict[type, Callable[..., Any]] = {}


def _init_function(cls: type) -> Callable[..., Any]:
    twin = writable_twin(cls)
    hooks = ("__attrs_pre_init__", "__attrs_post_init__")
    if twin is None or any(hasattr(cls, hook) for hook in hooks):
        return cls
    scope: dict[str, Any] = {"_m_twin": twin, "_m_cls": cls, "_m_nothing": attrs.NOTHING}
    parameters, lines = ["*"], []
    for index, field in enumerate(attrs.fields(cls)):
        plain = _field_lines(field, index, scope)
        if plain is None:
            return cls
        parameters.append(plain[0])
        lines += plain[1]
    if any(parameter.startswith("_m_") for parameter in parameters):
        return cls  # a field named as the function's own names: not worth a rename
    source = [
        f"def __init__({', '.join(parameters)}):",
        "    _m_v = _m_twin()",
        *lines,
        "    _m_v.__class__ = _m_cls",
        "    return _m_v",
    ]
    exec(compile("\n".join(source), f"<constructor of {cls.__qualname__}>", "exec"), scope)
    made: Callable[..., Any] = scope["__init__"]
    made.__qualname__ = f"{cls.__qualname__}.__init__"  # its TypeErrors read as attrs' do
    return made


def _field_lines(
    field: attrs.Attribute[Any], index: int, scope: dict[str, Any]
) -> tuple[str, list[str]] | None:
    """One field's parameter and lines of `_init_function`'s function, or None: not plain."""
    if not field.init or field.validator is not None or field.alias != field.name:
        return None
    name, value = field.name, field.alias
    lines = []
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            return None
        scope[f"_m_factory{index}"] = default.factory
        parameter = f"{name}=_m_nothing"
        lines.append(f"    if {name} is _m_nothing: {name} = _m_factory{index}()")
    elif default is attrs.NOTHING:
        parameter = name
    else:
        scope[f"_m_default{index}"] = default
        parameter = f"{name}=_m_default{index}"
    converter: Any = field.converter
    if type(converter) is attrs.Converter:
        held: Any = converter  # attrs' stub declares none of what a Converter holds
        if held.takes_self:
            return None
        scope[f"_m_convert{index}"] = held.converter
        scope[f"_m_field{index}"] = field
        arguments = f"{value}, _m_field{index}" if held.takes_field else value
        value = f"_m_convert{index}({arguments})"
    elif converter is not None:
        scope[f"_m_convert{index}"] = converter
        value = f"_m_convert{index}({value})"
    lines.append(f"    _m_v.{name} = {value}")
    return parameter, lines
