"""What the supervisor reads through an engine: a run's events, its projections, the
persistent projections.

The supervisor is given an `Engine` (`engine.supervisor(...)` builds one), but it
depends only on this protocol, so the engine can build supervisors without the
supervisor depending on the engine back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, TypeVar
from uuid import UUID

from engine.readside import Projections
from events import Event
from projections import Projection

S = TypeVar("S")


class RunReader(Protocol):
    """The part of `Engine` the supervisor reads from."""

    @property
    def projections(self) -> Projections:
        """The store's persistent projections (for breakers scoped to a pipeline)."""

    def events(self, run_id: UUID | str, upto: int | datetime | None = None) -> list[Event]:
        """The run's events, oldest first, up to a version or a time."""

    def project(
        self,
        run_id: UUID | str,
        projection: Projection[S] | type[Projection[S]],
        *,
        at: int | datetime | None = None,
        tree: bool = False,
    ) -> S:
        """The state of `projection` over one run (and its children with `tree`)."""
