"""Building frozen attrs values without their generated __init__, for hot folds."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def build(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the slots=False, validator-free attrs class `cls` holding `fields`.

    Folding a long run creates one value per event; filling `__dict__` directly costs a
    fraction of the frozen __init__, which sets each field through object.__setattr__.
    """
    value = object.__new__(cls)
    object.__setattr__(value, "__dict__", fields)
    return value
