"""The base of every event: identity, position, time, topic and class version."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar
from uuid import UUID

import attrs

from events import _validation as fields
from events.values import TWIN_OF, fields_of, welcome_twins

EVENT_TYPES: dict[str, type[Event]] = {}
"""Every event class by its topic, the name it is stored under."""

Upcaster = Callable[[dict[str, Any]], None]


@attrs.frozen(kw_only=True)
class Event:
    """An immutable fact about one run, at one position of its stream.

    Subclasses add payload fields. A subclass whose fields change bumps
    `class_version` and defines ``upcast_vN_vN1(state)`` static methods that
    rewrite a stored state dict of version N in place to version N+1.
    """

    run_id: UUID = fields.run_id()
    version: int = fields.count(minimum=1)
    timestamp: datetime = fields.timestamp()

    class_version: ClassVar[int] = 1
    topic: ClassVar[str] = ""
    encoders: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    decoders: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if TWIN_OF in cls.__dict__:  # a builder's stand-in (`writable_twin`), no event class
            return
        if "topic" not in cls.__dict__:
            cls.topic = f"stagetrail:{cls.__name__}"
        taken = EVENT_TYPES.get(cls.topic)
        if taken is not None and not _slotted_copy(cls, taken):
            raise TypeError(f"event topic {cls.topic!r} is taken by {taken!r}")
        if type(cls.class_version) is not int or cls.class_version < 1:
            raise TypeError(f"{cls.__name__}.class_version must be an int >= 1")
        missing = [f"upcast_v{v}_v{v + 1}" for v in range(1, cls.class_version)]
        missing = [name for name in missing if not hasattr(cls, name)]
        if missing:
            raise TypeError(
                f"{cls.__name__} is at class version {cls.class_version}: define {missing}"
            )
        EVENT_TYPES[cls.topic] = cls

    @property
    def originator_id(self) -> UUID:
        """The run id, under the name eventsourcing's protocols use."""
        return self.run_id

    @property
    def originator_version(self) -> int:
        """The version, under the name eventsourcing's protocols use."""
        return self.version

    def payload(self) -> dict[str, Any]:
        """The event's own fields (not run_id, version, timestamp) by name."""
        state = fields_of(self)
        del state["run_id"], state["version"], state["timestamp"]
        return state

    @classmethod
    def upcasters(cls, from_version: int) -> list[Upcaster]:
        """The upcasters that bring a stored state of `from_version` up to date."""
        return [
            getattr(cls, f"upcast_v{v}_v{v + 1}") for v in range(from_version, cls.class_version)
        ]


welcome_twins(Event)


def _slotted_copy(cls: type, taken: type) -> bool:
    """Whether `cls` is the slotted class attrs makes of `taken`, the class as written."""
    return "__slots__" not in taken.__dict__ and (cls.__module__, cls.__qualname__) == (
        taken.__module__,
        taken.__qualname__,
    )
