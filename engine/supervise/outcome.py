"""What a stage, task or give-up function may return to the supervisor besides a plain result."""

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
class Rollback:
    """What an `on_give_up` hook returns to undo outcomes instead of finishing the run ``failed``.

    ``Rollback(1, "round 3 broke the conversation")`` records a `StateRolledBack` of
    `steps` outcomes, and `drive` (or `step`) goes on from the state it leaves.
    """

    steps: int = attrs.field(default=1, validator=check.count)
    reason: str = attrs.field(default="", validator=attrs.validators.instance_of(str))


@attrs.frozen
class Spent:
    """What a task function returns to record its cost with its completion, atomically."""

    result: JSON
    amount: float = attrs.field(validator=check.non_negative)
    unit: str = attrs.field(default="usd", validator=check.name)
