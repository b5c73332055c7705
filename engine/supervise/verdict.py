"""The verdict a supervisor routed to a handler stage, folded from its note; how a run ended."""

from __future__ import annotations

from events import JSON, NoteAdded, RunFinished, StageCompleted
from projections import Projection, on

VERDICT_NOTE = "progress_verdict"
"""The note that records a stuck or partial verdict the table routes to a handler stage."""


class RoutedVerdict(Projection["dict[str, JSON] | None"]):
    """The routed verdict of a run (status, reason, handler, handled), or None before any.

    `handler` is the state the verdict sent the run to, and `handled` turns True
    once a stage function completed there: until then the handler's attempts are
    not stopped again.
    """

    scope = "run"

    def initial(self) -> dict[str, JSON] | None:
        """No verdict yet."""
        return None

    @on(NoteAdded)
    def noted(self, state: dict[str, JSON] | None, event: NoteAdded) -> dict[str, JSON] | None:
        """A verdict note replaces the one before; other notes pass over."""
        if event.key != VERDICT_NOTE or not isinstance(event.value, dict):
            return state
        return event.value

    @on(StageCompleted)
    def completed(
        self, state: dict[str, JSON] | None, event: StageCompleted
    ) -> dict[str, JSON] | None:
        """The handler's stage completed (an attempt of it: not the verdict's own outcome)."""
        if state is None or not event.attempt or state.get("handled"):
            return state
        if event.stage != state.get("handler"):
            return state
        return {**state, "handled": True}


class Ending(Projection["dict[str, JSON] | None"]):
    """How the run finished (status, reason), or None while it runs."""

    scope = "run"

    def initial(self) -> dict[str, JSON] | None:
        """Not finished."""
        return None

    @on(RunFinished)
    def finished(self, state: dict[str, JSON] | None, event: RunFinished) -> dict[str, JSON]:
        """The run's end."""
        return {"status": event.status, "reason": event.reason}
