"""What a stage or task function may return to the supervisor besides a plain result."""

from __future__ import annotations

import attrs

from engine.supervise import validators as check
from events import JSON


@attrs.frozen
class Outcome:
    """What a stage function returns to name its outcome: ``Outcome("needs_refactor", result)``."""

    outcome: str = attrs.field(validator=check.name)
    result: JSON = None


@attrs.frozen
class Spent:
    """What a task function returns to record its cost with its completion, atomically."""

    result: JSON
    amount: float = attrs.field(validator=check.non_negative)
    unit: str = attrs.field(default="usd", validator=check.name)
