"""Building frozen values without their generated __init__, for the hot paths.

The one way stagetrail builds a frozen attrs value (or eventsourcing's frozen
`StoredEvent`) from fields it has already checked: decoding stored events,
folding a run's machine state, folding projections.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def build(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the slots=False class `cls` holding `fields`.

    Folding a long run creates one value per event; filling `__dict__` directly costs a
    fraction of the frozen __init__, which sets each field through object.__setattr__.
    """
    value = object.__new__(cls)
    object.__setattr__(value, "__dict__", fields)
    return value


def evolve(value: T, /, **changes: Any) -> T:
    """A copy of `value` (built by `build` or its class) with `changes`, skipping __init__.

    `attrs.evolve` re-reads the class's fields and runs __init__ on every call;
    for a validator-free, slots=False class a dict merge gives the same value.
    """
    return build(type(value), {**value.__dict__, **changes})
