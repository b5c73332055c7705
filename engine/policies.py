"""Retry policies and the values a stage or task function may return to the supervisor.

All are frozen attrs values: a policy decides from facts (the failure, the
retry number, a random draw) and never sleeps or reads a clock itself.
"""

from __future__ import annotations

import math
import random
from typing import Any

import attrs

from events import JSON


def _non_negative(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) not in (int, float) or not 0 <= value < math.inf:  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a finite number >= 0, got {value!r}")


def _count(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{field.name} must be an int >= 0, got {value!r}")


def _fraction(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) not in (int, float) or not 0 <= value <= 1:  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a number from 0 to 1, got {value!r}")


def _at_least_one(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) not in (int, float) or not 1 <= value < math.inf:  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a finite number >= 1, got {value!r}")


def _timeout(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (type(value) not in (int, float) or not 0 < value < math.inf):  # type: ignore[operator]
        raise ValueError(
            f"{field.name} must be a positive number of seconds or None, got {value!r}"
        )


def _exception_types(value: object) -> tuple[type[BaseException], ...]:
    types = value if isinstance(value, tuple | list) else (value,)
    for kind in types:
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise ValueError(f"expected exception classes, got {kind!r}")
    return tuple(types)


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How often and how soon a failed attempt is tried again.

    Attributes:
        max_retries: retries after the first failure of a stage (its failures since
            its last completion count, so the budget survives a restart).
        delay: seconds before the first retry.
        backoff: multiplier of the delay for each further retry.
        max_delay: the delay never exceeds this.
        jitter: a random share (0-1) added or taken off each delay.
        timeout: seconds an attempt may take; a late attempt fails as ``"Timeout"``.
        retry_on: exception types that may be retried.
        give_up_on: exception types never retried (checked first).
    """

    max_retries: int = attrs.field(default=3, validator=_count)
    delay: float = attrs.field(default=1.0, validator=_non_negative)
    backoff: float = attrs.field(default=2.0, validator=_at_least_one)
    max_delay: float = attrs.field(default=60.0, validator=_non_negative)
    jitter: float = attrs.field(default=0.0, validator=_fraction)
    timeout: float | None = attrs.field(default=None, validator=_timeout)
    retry_on: tuple[type[BaseException], ...] = attrs.field(
        default=(Exception,), converter=_exception_types
    )
    give_up_on: tuple[type[BaseException], ...] = attrs.field(
        default=(), converter=_exception_types
    )

    def retryable(self, error: BaseException) -> bool:
        """Whether `error` may be retried at all (`give_up_on` wins over `retry_on`)."""
        return not isinstance(error, self.give_up_on) and isinstance(error, self.retry_on)

    def delay_for(self, retry: int, rng: random.Random | None = None) -> float:
        """The delay before retry number `retry` (1-based): backoff, cap, then jitter."""
        try:
            base = min(self.delay * self.backoff ** (retry - 1), self.max_delay)
        except OverflowError:  # a huge retry number: the cap was reached long ago
            base = self.max_delay
        if not self.jitter or not base:
            return float(base)
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return float(min(max(0.0, base * (1 + spread)), self.max_delay))

    def to_json(self) -> dict[str, JSON]:
        """The policy as JSON, recorded with each decision it made."""
        return {
            "max_retries": self.max_retries,
            "delay": self.delay,
            "backoff": self.backoff,
            "max_delay": self.max_delay,
            "jitter": self.jitter,
            "timeout": self.timeout,
            "retry_on": [kind.__name__ for kind in self.retry_on],
            "give_up_on": [kind.__name__ for kind in self.give_up_on],
        }


def _outcome_name(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not str or not value:
        raise ValueError(f"{field.name} must be a non-empty str, got {value!r}")


@attrs.frozen
class Outcome:
    """What a stage function returns to name its outcome: ``Outcome("needs_refactor", result)``."""

    outcome: str = attrs.field(validator=_outcome_name)
    result: JSON = None


@attrs.frozen
class Spent:
    """What a task function returns to record its cost with its completion, atomically."""

    result: JSON
    amount: float = attrs.field(validator=_non_negative)
    unit: str = attrs.field(default="usd", validator=_outcome_name)
