"""What the decision generator asks its driver to do, and what it is sent back.

The generator in `engine.supervise.decisions` does no I/O: it yields a `Record`
(events to record on the run), a `Read` (a question only the store or the
caller's code can answer), a `Call` (run the function) or a `Pause`, and the
driver in `engine.supervise.supervisor` performs it and sends back the answer,
how the call `Ended`, or None.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias
from uuid import UUID

import attrs

from events import JSON, Event

if TYPE_CHECKING:
    from engine.run import Run
    from engine.supervise.context import StageContext

Payload: TypeAlias = Mapping[str, Any]
"""What one event records: the keyword arguments of the `Run` method that records its kind
(`stage_started`, `stage_completed`, `stage_failed`, `task_failed`), else its fields."""


@attrs.frozen
class Record:
    """Record these events on the run, in order; `together`: in one transaction, or none."""

    events: tuple[tuple[type[Event], Payload], ...]
    together: bool = False


@attrs.frozen
class RunHistory:
    """Every event of the run its handle holds: the stored ones, then the pending ones."""

    run: Run


@attrs.frozen
class TreeSpending:
    """What the tree of runs `run_id` belongs to spent in `unit` (its root's tree)."""

    run_id: UUID
    unit: str


@attrs.frozen
class PipelineCircuits:
    """Each stage's circuit over every run of the run's pipeline, the run's own recorded
    events included."""

    run: Run


@attrs.frozen
class PolicyAnswer:
    """The `RetryPolicy` a policy function chooses for the next attempt of `stage`."""

    choose: Callable[[StageContext], Any]
    run: Run
    stage: str

    def ask(self, context: StageContext) -> Any:
        """Call the policy function (the caller's code) with the stage's context."""
        return self.choose(context)


@attrs.frozen
class GiveUpAnswer:
    """What the supervisor's `on_give_up` hook answers to a stage that gave up in `drive`:
    a `Rollback`, or None to finish the run ``failed``."""

    hook: Callable[[StageContext, Any], Any]
    run: Run
    stage: str
    gave_up: Exception

    def ask(self, context: StageContext) -> Any:
        """Call the hook (the caller's code) with the stage's context."""
        return self.hook(context, self.gave_up)


CallerQuestion: TypeAlias = "PolicyAnswer | GiveUpAnswer"
"""A question the caller's code answers, given a `StageContext` (the drivers ask it)."""

Question: TypeAlias = RunHistory | TreeSpending | PipelineCircuits | PolicyAnswer | GiveUpAnswer
"""What a `Read` may ask."""


@attrs.frozen
class Read:
    """Answer `question` (the store's, or the caller's policy function's); sent back."""

    question: Question


@attrs.frozen
class Call:
    """Run the function once; fail it as a timeout after `timeout` seconds."""

    timeout: float | None


@attrs.frozen
class Pause:
    """Sleep this many seconds before the next attempt."""

    seconds: float


@attrs.frozen
class Ended:
    """How a call ended: its value, or the exception it raised, and its duration."""

    value: Any = None
    error: Exception | None = None
    duration: float = 0.0


@attrs.frozen
class Attempted:
    """A stage's last attempt: its result, or `routed` when a failure moved the run on.

    A routed attempt carries what `execute` raises for it: the stage gave up there.
    """

    result: JSON = None
    routed: bool = False
    gave_up: Exception | None = None


Command: TypeAlias = Record | Read | Call | Pause
"""What the decision generator yields."""

Step: TypeAlias = Generator[Command, Any, Any]
"""A decision generator: yields commands, is sent their answers, returns its result."""
