"""Pure conversion between event objects and JSON-ready state dicts.

The bytes, compression and encryption around these dicts are eventsourcing's
(its transcoder, compressor and cipher); this module only knows field shapes
and class versions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from itertools import repeat
from operator import call, itemgetter
from typing import Any
from uuid import UUID

import attrs

from events.base import EVENT_TYPES, Event
from events.errors import EventFormatError
from events.values import build, slot_setters, writable_twin

# Bound once, at import: freezegun rebinds a module's `datetime` while time is frozen,
# and a per-class reader made then would go on building its fake datetimes after it.
_parse_time = datetime.fromisoformat


def encode(event: Event) -> tuple[str, dict[str, Any]]:
    """Return the event's topic and its payload plus timestamp as a JSON-ready dict."""
    topic, state = encode_timed(event)
    state["timestamp"] = event.timestamp.isoformat()
    return topic, state


def encode_timed(event: Event) -> tuple[str, dict[str, Any]]:
    """`encode`, the timestamp left a datetime: for an encoder that writes it as ISO 8601."""
    cls = type(event)
    write = _WRITERS.get(cls) or _writer_of(cls)
    return cls.topic, write(event)


_WRITERS: dict[type[Event], Callable[[Event], dict[str, Any]]] = {}
"""`_writer` of each event class encoded so far, made once."""


def _writer_of(cls: type[Event]) -> Callable[[Event], dict[str, Any]]:
    """The class's state writer (`_writer`), made on its first encoding."""
    write = _WRITERS[cls] = _writer(cls)
    return write


def _writer(cls: type[Event]) -> Callable[[Event], dict[str, Any]]:
    """A function giving an event's stored state: its fields but run_id and version, in
    declared order, each through the class's encoder if it has one, then its class version
    past 1. One dict display per event: every recorded event is encoded here.
    """
    names = [field.name for field in attrs.fields(cls) if field.name not in ("run_id", "version")]
    missing = [name for name in cls.encoders if name not in names]
    if missing:
        return _unwritable(missing[0])
    scope: dict[str, Any] = {}
    items = []
    for index, name in enumerate(names):
        value = f"v.{name}"
        if name in cls.encoders:
            scope[f"encoder{index}"] = cls.encoders[name]
            value = f"encoder{index}({value})"
        items.append(f"{name!r}: {value}")
    if cls.class_version > 1:
        items.append(f"'class_version': {cls.class_version!r}")
    lines = ["def write(v):", "    return {" + ", ".join(items) + "}"]
    exec(compile("\n".join(lines), f"<state writer of {cls.__qualname__}>", "exec"), scope)
    return scope["write"]  # type: ignore[no-any-return]


def _unwritable(name: str) -> Callable[[Event], dict[str, Any]]:
    """The writer of a class with an encoder of `name`, no stored field: it names it."""

    def write(event: Event) -> dict[str, Any]:
        raise KeyError(name)

    return write


def decode(topic: str, state: dict[str, Any], run_id: UUID, version: int) -> Event:
    """Rebuild an event from a stored state dict, upcasting older class versions.

    Raises:
        EventFormatError: unknown topic, a class version newer than this code, or
            a state that does not fit the class.
    """
    cls = _event_type(topic)
    if not isinstance(state, dict):
        raise EventFormatError(topic, f"stored state is a {type(state).__name__}, not an object")
    _upcast(cls, state)
    # As many keys as fields, the timestamp among them: any other field missing
    # would leave an unknown key in its place, which `build` below finds missing.
    if len(state) != len(_stored_fields(cls)) or "timestamp" not in state:
        raise EventFormatError(topic, _field_mismatch(cls, state))
    field = "timestamp"
    try:
        state["timestamp"] = _parse_time(state["timestamp"])
        for field, decoder in cls.decoders.items():
            state[field] = decoder(state[field])
    except (LookupError, TypeError, ValueError, AttributeError) as error:
        # a decoder given a value of the wrong shape ([] as a fork point, 5 as a run id)
        if state.keys() != _stored_fields(cls):
            raise EventFormatError(topic, _field_mismatch(cls, state)) from None
        raise EventFormatError(topic, f"bad field value of {field!r}: {error!r}") from error
    if "run_id" in state or "version" in state:  # stored keys the event sets itself
        raise EventFormatError(topic, _field_mismatch(cls, state))
    state["run_id"] = run_id
    state["version"] = version
    # Trusted data from the store: skip the constructor's checks, as eventsourcing does.
    try:
        return build(cls, state)
    except KeyError:
        del state["run_id"], state["version"]
        raise EventFormatError(topic, _field_mismatch(cls, state)) from None


def decode_many(
    rows: Iterable[tuple[str, Any, int]], run_id: UUID, *, extra: str | None = None
) -> list[Event]:
    """`decode` of many events of one run: (topic, state, version) each, in order.

    Each is built by its class's reader (`_class_reader`, made once per class), as
    `read_each` builds a stream's; anything else goes through `decode`, which checks
    and upcasts it (or names what is wrong).

    Args:
        extra: a key a state may hold beside its fields (the store's own), ignored.

    Raises:
        EventFormatError: as `decode` does.
    """
    page = list(rows)
    versions = [(version, topic) for topic, _, version in page]
    return list(read_each(versions, [state for _, state, _ in page], run_id, extra, None))


Alone = Callable[[UUID, tuple[Any, ...]], Event]
"""Reads one row (version, topic, ...) again from what is stored, naming it if unreadable."""


def read_each(
    rows: Sequence[tuple[Any, ...]],
    states: Sequence[Any],
    run_id: UUID,
    extra: str | None,
    alone: Alone | None,
) -> Iterator[Event]:
    """`decode` of one run's events, one at a time, as a stream takes them: rows (version,
    topic, ...) in order, beside their decoded states.

    Each event is built by its class's reader (`_class_reader`) when it is taken, or else
    by `decode` (upcast); a state `decode` refuses goes to `alone` with its row, which
    reads it again from what is stored and names the event that is wrong (None: the
    `EventFormatError` is raised). The iterator is C's `map` calling one reader per
    event, the page given to each (`_PageReaders`): no generator of ours per event, no
    reader bound to a page.

    Args:
        extra: a key a state may hold beside its fields (the store's own), ignored.

    Raises:
        ValueError: not as many states as rows.
        EventFormatError: a state `decode` refuses, `alone` None (as the iterator reaches it).
    """
    if len(rows) != len(states):
        raise ValueError(f"{len(rows)} rows but {len(states)} states")
    # per call: a topic may have a new class
    readers = _PageReaders()  # its fields set here: no `__init__` of ours to call per page
    readers.run_id, readers.alone = run_id, alone
    readers.extra = _NO_KEY if extra is None else extra
    return map(call, map(readers.__getitem__, map(_TOPIC, rows)), states, rows, repeat(readers))


_TOPIC = itemgetter(1)
_NO_KEY: Any = object()
"""`extra` where there is none: a key no state holds (None may be one), so none is ignored."""
_Read = Callable[[Any, tuple[Any, ...], "_PageReaders"], Event]
"""A reader of one topic: `(state, row, page) -> event`, the run and the rest from `page`."""


class _PageReaders(dict[str, _Read]):
    """One page's reader of each topic (a class's, `_class_reader`), and what the readers
    take from the page (its run, `alone`, `extra`): looked up in `EVENT_TYPES` once a page,
    since a topic may be given a class (or another class) after an earlier read."""

    __slots__ = ("alone", "extra", "run_id")  # no `__dict__` made per page

    run_id: UUID
    alone: Alone | None
    extra: str | None

    def __missing__(self, topic: str) -> _Read:
        cls = EVENT_TYPES.get(topic)
        read = _slow_only if cls is None else _CLASS_READERS.get(cls) or _reader_of(cls)
        self[topic] = read
        return read


def _slow(
    topic: str,
    state: Any,
    run_id: UUID,
    row: tuple[Any, ...],
    alone: Alone | None,
    extra: str | None,
) -> Event:
    """The event of `row` as `decode` reads `state` (upcast), else as `alone` reads it."""
    if type(state) is dict:
        state.pop(extra, None)
    if alone is None:
        return decode(topic, state, run_id, row[0])
    try:
        return decode(topic, state, run_id, row[0])
    except EventFormatError:
        return alone(run_id, row)


def _slow_only(state: Any, row: tuple[Any, ...], page: _PageReaders) -> Event:
    """The reader of a topic no class is stored under (`decode` names it)."""
    return _slow(row[1], state, page.run_id, row, page.alone, page.extra)


_CLASS_READERS: dict[type[Event], _Read] = {}
"""`_class_reader` of each event class read so far, made once."""


def _reader_of(cls: type[Event]) -> _Read:
    """The class's reader (`_class_reader`), made on its first read."""
    read = _CLASS_READERS[cls] = _class_reader(cls)
    return read


def _class_reader(cls: type[Event]) -> _Read:
    """The class's reader `(state, row, page) -> event` for `read_each`, the run and the
    rest taken from `page` (`_PageReaders`): the one code generator of the event readers.

    The reader builds the event, its slots set in its own body (no call of `maker` per
    event; in its writable twin, `writable_twin`, where it has one), when `state` holds
    exactly the class's stored fields at its current class version, and `extra` or not;
    anything else goes to `_slow` untouched.
    """
    if not cls.decoders.keys() <= _stored_fields(cls) - {"timestamp"}:
        return _slow_only  # a decoder of no payload field: `decode` says so, or runs it
    later = cls.class_version if cls.class_version > 1 else 0
    keys = len(_stored_fields(cls)) + (later > 0)
    twin = writable_twin(cls)  # filled by plain stores, then made a `cls`
    scope: dict[str, Any] = {
        "new": object.__new__, "cls": cls, "twin": twin, "parse": _parse_time, "slow": _slow,
    }  # fmt: skip
    body = ["        v = new(cls)" if twin is None else "        v = twin()"]
    for index, (name, setter) in enumerate(slot_setters(cls).items()):
        scope[f"set{index}"] = setter
        if name == "run_id":
            value = "page.run_id"
        elif name == "version":
            value = "row[0]"
        elif name == "timestamp":
            value = "parse(state['timestamp'])"
        elif name in cls.decoders:
            scope[f"decoder{index}"] = cls.decoders[name]
            value = f"decoder{index}(state[{name!r}])"
        else:
            value = f"state[{name!r}]"
        body.append(
            f"        set{index}(v, {value})" if twin is None else f"        v.{name} = {value}"
        )
    if twin is not None:
        body.append("        v.__class__ = cls")
    # As many keys as stored fields, or one more that is `extra`, each field read by name:
    # so no other key can be there.
    check = f"(n == {keys} or (n == {keys + 1} and page.extra in state))"
    if later:  # `_upcast`'s test: the stored version is this int (not 2.0, not True)
        check += (
            f" and (stored := state.get('class_version')).__class__ is int and stored == {later}"
        )
    lines = [
        "def read(state, row, page):",
        "  if state.__class__ is dict:",
        "    n = len(state)",
        f"    if {check}:",
        "      try:",
        *body,
        "        return v",
        "      except (LookupError, TypeError, ValueError, AttributeError):",
        "        pass",
        "  return slow(row[1], state, page.run_id, row, page.alone, page.extra)",
    ]
    exec(compile("\n".join(lines), f"<reader of {cls.__qualname__}>", "exec"), scope)
    return scope["read"]  # type: ignore[no-any-return]


_STORED_FIELDS: dict[type[Event], frozenset[str]] = {}


def _stored_fields(cls: type[Event]) -> frozenset[str]:
    fields = _STORED_FIELDS.get(cls)
    if fields is None:
        names = frozenset(field.name for field in attrs.fields(cls))
        fields = _STORED_FIELDS[cls] = names - {"run_id", "version"}
    return fields


def _field_mismatch(cls: type[Event], state: dict[str, Any]) -> str:
    missing = sorted(_stored_fields(cls) - state.keys())
    unknown = sorted(state.keys() - _stored_fields(cls))
    return f"fields do not match {cls.__name__}: missing {missing}, unknown {unknown}"


def _event_type(topic: str) -> type[Event]:
    try:
        return EVENT_TYPES[topic]
    except KeyError:
        raise EventFormatError(
            topic, "unknown event type (written by a newer or foreign program?)"
        ) from None


def _upcast(cls: type[Event], state: dict[str, Any]) -> None:
    stored_version = state.pop("class_version", 1)
    if stored_version == cls.class_version and type(stored_version) is int:
        return  # the common case: written by this code, nothing to upcast
    if type(stored_version) is not int or stored_version < 1:
        raise EventFormatError(cls.topic, f"class version {stored_version!r} is not a version")
    if stored_version > cls.class_version:
        raise EventFormatError(
            cls.topic,
            f"class version {stored_version} is newer than this stagetrail's "
            f"{cls.class_version}; upgrade stagetrail to read this store",
        )
    for upcaster in cls.upcasters(stored_version):
        try:
            upcaster(state)
        except Exception as error:  # an upcaster meeting data it did not expect
            raise EventFormatError(
                cls.topic, f"{upcaster.__name__} failed: {type(error).__name__}: {error}"
            ) from error
