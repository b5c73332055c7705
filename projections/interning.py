"""One copy of each name and error text a long run's folded values repeat."""

from __future__ import annotations

from sys import intern
from typing import TypeVar

T = TypeVar("T")


def interned(value: T) -> T:
    """`value` interned when it is a plain `str`; anything else (a stored None, since
    decoding trusts the store) is returned as it was, so a fold never fails on it."""
    if value.__class__ is str:
        return intern(value)  # type: ignore[call-overload, no-any-return]  # `cast` is a call
    return value
