"""One copy of each name and error text a long run's folded values repeat."""

from __future__ import annotations

from sys import intern
from typing import TypeVar, cast

T = TypeVar("T")


def interned(value: T) -> T:
    """`value` interned when it is a plain `str`; anything else (a stored None, since
    decoding trusts the store) is returned as it was, so a fold never fails on it."""
    if value.__class__ is str:
        return cast(T, intern(cast(str, value)))
    return value
