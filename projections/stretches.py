"""Folding a run's stretches of stage outcomes into one state each, built at a stretch's end.

A long loop's run is nearly all outcomes (`StageCompleted`, `StageFailed`), one after
another. A projection whose state is a big frozen value can take them into a mutable
`Stretch` of its own and make the value once, when the stretch ends (another event, a
declined outcome, the fold's end), instead of once per outcome; every other event goes to
`apply`. The state is the same as `apply`'s event after event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from events import Event, StageCompleted, StageFailed
from projections import collector
from projections.errors import ProjectionError

S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)


class Stretch(Protocol[S_co]):
    """Outcomes taken since a state, the state after them made when asked for."""

    def took(self, event: Any) -> bool:
        """Take the outcome `event` as the projection's handler would; False: leave it to
        `apply` (nothing taken)."""

    def made(self) -> S_co:
        """The state after the outcomes taken."""


def plain(state: object, cls: type, *mappings: object) -> bool:
    """Whether `state` is a `cls` itself, each of its `mappings` a dict: a state a stretch's
    copies remake as they were. From any other (a subclass, counts in another mapping) a
    stretch would end in another class where `apply` keeps the state as it is (a verdict, an
    outcome that changes nothing), so its projection's `begun` leaves it to `apply`."""
    return state.__class__ is cls and all(mapping.__class__ is dict for mapping in mappings)


def folded_in_stretches(
    name: str,
    apply: Callable[[S, Event], S],
    begun: Callable[[S], Stretch[S] | None],
    events: Iterable[Event],
    current: S,
    tick: Callable[[], None],
) -> S:
    """`events` folded from `current`: each stretch of outcomes into the `Stretch` that
    `begun` gives for the state before it (None: `apply` takes this outcome), the rest by
    `apply`; `tick` called every `collector.COLLECT_EVERY` events.

    Raises:
        ProjectionError: a stretch failed to take an outcome (names `name` and the event).
    """
    left = every = collector.COLLECT_EVERY
    stretch: Stretch[S] | None = None
    for event in events:
        kind = event.__class__
        if (kind is StageCompleted or kind is StageFailed) and (
            stretch is not None or (stretch := begun(current)) is not None
        ):
            try:
                taken = stretch.took(event)
            except Exception as error:
                raise ProjectionError(name, event, error) from error
            if not taken:  # the handler's own case: `apply` from the state so far
                current, stretch = apply(stretch.made(), event), None
        else:
            if stretch is not None:
                current, stretch = stretch.made(), None
            current = apply(current, event)
        left -= 1
        if not left:
            tick()
            left = every
    return current if stretch is None else stretch.made()
