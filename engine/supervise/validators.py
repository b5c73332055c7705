"""Checks of policy fields: each names the field and what it must be."""

from __future__ import annotations

import math
from typing import Any

import attrs

from engine.supervise.breaker import MAX_WINDOW, SCOPES


def non_negative(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """A finite number >= 0."""
    if type(value) not in (int, float) or not 0 <= value < math.inf:  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a finite number >= 0, got {value!r}")


def positive(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """A finite number > 0."""
    if type(value) not in (int, float) or not 0 < value < math.inf:  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a finite number > 0, got {value!r}")


def count(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """An int >= 0."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{field.name} must be an int >= 0, got {value!r}")


def fraction(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """A number from 0 to 1."""
    if type(value) not in (int, float) or not 0 <= value <= 1:  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a number from 0 to 1, got {value!r}")


def at_least_one(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """A finite number >= 1."""
    if type(value) not in (int, float) or not 1 <= value < math.inf:  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a finite number >= 1, got {value!r}")


def timeout(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """None, or a finite number of seconds > 0."""
    if value is not None and (type(value) not in (int, float) or not 0 < value < math.inf):  # type: ignore[operator]
        raise ValueError(
            f"{field.name} must be a positive number of seconds or None, got {value!r}"
        )


def positive_or_none(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """An int >= 1, or None (no limit)."""
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError(f"{field.name} must be a positive int or None, got {value!r}")


def rate_or_none(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """A number in (0, 1], or None (off)."""
    if value is not None and (type(value) not in (int, float) or not 0 < value <= 1):  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a number in (0, 1] or None, got {value!r}")


def window(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """An int from 1 to MAX_WINDOW."""
    if type(value) is not int or not 1 <= value <= MAX_WINDOW:
        raise ValueError(f"{field.name} must be an int from 1 to {MAX_WINDOW}, got {value!r}")


def scope(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """One of the breaker scopes."""
    if value not in SCOPES:
        raise ValueError(f"{field.name} must be one of {SCOPES}, got {value!r}")


def spending_scope(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """Whose spending a limit counts: "run" or "tree"."""
    if value not in ("run", "tree"):
        raise ValueError(f"{field.name} must be 'run' or 'tree', got {value!r}")


def budget(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """What a retry budget counts: "stage" or "run"."""
    if value not in ("stage", "run"):
        raise ValueError(f"{field.name} must be 'stage' or 'run', got {value!r}")


def boolean(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """A bool."""
    if type(value) is not bool:
        raise ValueError(f"{field.name} must be a bool, got {value!r}")


def name(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    """A non-empty str."""
    if type(value) is not str or not value:
        raise ValueError(f"{field.name} must be a non-empty str, got {value!r}")
