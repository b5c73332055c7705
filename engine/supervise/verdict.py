"""The progress verdict a supervisor routed to a handler stage, folded from its note."""

from __future__ import annotations

from events import JSON, NoteAdded
from projections import Projection, on

VERDICT_NOTE = "progress_verdict"
"""The note that records a stuck or partial verdict the table routes to a handler stage."""


class RoutedVerdict(Projection["dict[str, JSON] | None"]):
    """The newest routed verdict of a run (status, reason), or None before any."""

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
