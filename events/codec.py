"""Pure conversion between event objects and JSON-ready state dicts.

The bytes, compression and encryption around these dicts are eventsourcing's
(its transcoder, compressor and cipher); this module only knows field shapes
and class versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

import attrs

from events.base import EVENT_TYPES, Event
from events.errors import EventFormatError
from events.values import build, builder, fields_of


def encode(event: Event) -> tuple[str, dict[str, Any]]:
    """Return the event's topic and its payload plus timestamp as a JSON-ready dict."""
    topic, state = encode_timed(event)
    state["timestamp"] = event.timestamp.isoformat()
    return topic, state


def encode_timed(event: Event) -> tuple[str, dict[str, Any]]:
    """`encode`, the timestamp left a datetime: for an encoder that writes it as ISO 8601."""
    cls = type(event)
    state = fields_of(event)
    del state["run_id"], state["version"]
    for name, encoder in cls.encoders.items():
        state[name] = encoder(state[name])
    if cls.class_version > 1:
        state["class_version"] = cls.class_version
    return cls.topic, state


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
    try:
        state["timestamp"] = datetime.fromisoformat(state["timestamp"])
        for name, decoder in cls.decoders.items():
            state[name] = decoder(state[name])
    except (KeyError, TypeError, ValueError) as error:
        if state.keys() != _stored_fields(cls):
            raise EventFormatError(topic, _field_mismatch(cls, state)) from None
        raise EventFormatError(topic, f"bad field value: {error!r}") from error
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

    The common case (the class's current version, as many keys as fields) is
    built inline, its field decoders too, with the lookups made once per topic;
    anything else goes through `decode`, which checks and upcasts it.

    Args:
        extra: a key a state may hold beside its fields (the store's own), dropped first.

    Raises:
        EventFormatError: as `decode` does.
    """
    events: list[Event] = []
    append = events.append
    plans = _PLANS
    parse = datetime.fromisoformat
    for topic, state, version in rows:
        plan = plans.get(topic)
        if plan is None or plan[2] is not EVENT_TYPES.get(topic):
            plan = _plan(topic)
        if type(state) is not dict:
            append(decode(topic, state, run_id, version))
            continue
        if extra is not None:
            state.pop(extra, None)
        # Inline, the test `decode` makes first: current version, as many keys as fields
        # (a class at version 1 stores no version key; a later one stores its number).
        if (
            plan is False
            or len(state) != plan[0]
            or (plan[3] and not _current(state, plan[3]))
            or (not plan[3] and "class_version" in state)
            or "run_id" in state  # stored keys the event sets itself
            or "version" in state
        ):
            append(decode(topic, state, run_id, version))
            continue
        try:
            stamp = parse(state["timestamp"])
            # Every field decoded before any is written: `decode` may need the state whole.
            decoded = [(name, field(state[name])) for name, field in plan[4]] if plan[4] else ()
        except (KeyError, TypeError, ValueError):
            if plan[3]:  # `_current` took the version key: `decode` must not upcast
                state["class_version"] = plan[3]
            append(decode(topic, state, run_id, version))  # names what is wrong
            continue
        state["timestamp"] = stamp
        for name, value in decoded:
            state[name] = value
        state["run_id"] = run_id
        state["version"] = version
        try:
            append(plan[1](state))
        except KeyError:
            del state["run_id"], state["version"]
            raise EventFormatError(topic, _field_mismatch(plan[2], state)) from None
    return events


_PLANS: dict[str, Any] = {}
"""`_plan` of each topic decoded so far, made once (checked against `EVENT_TYPES` each use:
a topic may be given a class after its first read)."""


def _plan(topic: str) -> Any:
    """(stored keys, builder, class, current version if > 1 else 0, field decoders) for
    `decode_many`'s inline path, or False for `decode`'s (an unknown topic: not kept)."""
    cls = EVENT_TYPES.get(topic)
    if cls is None:
        return False
    later = cls.class_version if cls.class_version > 1 else 0
    decoders = tuple(cls.decoders.items())
    plan = len(_stored_fields(cls)) + (later > 0), builder(cls), cls, later, decoders
    _PLANS[topic] = plan
    return plan


def _current(state: dict[str, Any], version: int) -> bool:
    """Whether `state` stores class version `version` (then its version key is dropped)."""
    stored = state.get("class_version")
    if stored != version or type(stored) is not int:
        return False
    del state["class_version"]
    return True


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
