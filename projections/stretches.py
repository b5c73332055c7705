"""Folding a run's stretches of stage outcomes into one state each, built at a stretch's end.

A long loop's run is nearly all outcomes (`StageCompleted`, `StageFailed`), one after
another. A projection whose state is a big frozen value can take them into a mutable
`Stretch` of its own and make the value once, when the stretch ends (another event, a
declined outcome, the fold's end), instead of once per outcome; every other event goes to
`apply`. The state is the same as `apply`'s event after event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from events import Event, StageCompleted, StageFailed
from projections import collector
from projections.base import Folding, Projection
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


class LongStretch(Stretch[S_co], Protocol[S_co]):
    """A `Stretch` that takes a run of outcomes in one call, its loop over them its own."""

    def took_from(
        self, event: Event, rest: Iterator[Event], name: str, tick: Callable[[], None]
    ) -> Event | None:
        """Take `event` and the events after it from `rest`, each as `took` would, until one
        it does not take (any but an outcome, too): that one, else None (`rest` ran out).

        Raises:
            ProjectionError: taking an event failed (names `name` and the event).
        """

    def made_deferred(self) -> S_co:
        """`made`, what walking the state would make left until it is walked (a writer's
        state, stored and let go: `StretchFolding.state`)."""


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
    current, stretch = _stretched(name, apply, begun, events, current, None, tick)
    return current if stretch is None else stretch.made()


class StretchFolding(Folding[S]):
    """A `Folding` whose newest stretch of outcomes stays open between parts: a long loop's
    state is made when asked for, not at the end of every part fed (a writer's commit)."""

    def __init__(
        self,
        projection: Projection[S],
        begun: Callable[[S], Stretch[S] | None],
        state: S,
    ) -> None:
        super().__init__(projection, state)
        self._begun = begun
        self._stretch: Stretch[S] | None = None

    def feed(self, events: Sequence[Event]) -> None:
        """Fold `events`, the next ones (raises as `Projection.fold` does).

        The collector is left as it is (`collector.collector_paused` is for long folds):
        a part is a commit's, and an open stretch allocates next to nothing per outcome,
        while restoring the collector's threshold after each part would set it off.
        """
        projection = self.projection
        self._state, self._stretch = _stretched(
            projection.name, projection.apply, self._begun, events, self._state, self._stretch,
            collector.no_tick,
        )  # fmt: skip

    def state(self) -> S:
        """The state after every event fed (the open stretch's made now, left open: by its
        `made_deferred` where it has one, what walking the state would make left undone)."""
        stretch = self._stretch
        if stretch is None:
            return self._state
        return getattr(stretch, "made_deferred", stretch.made)()


def _stretched(
    name: str,
    apply: Callable[[S, Event], S],
    begun: Callable[[S], Stretch[S] | None],
    events: Iterable[Event],
    current: S,
    stretch: Stretch[S] | None,
    tick: Callable[[], None],
) -> tuple[S, Stretch[S] | None]:
    """`folded_in_stretches` from `current` and the open `stretch` taken since it (None:
    none open); the state and the stretch still open after `events`."""
    left = every = collector.COLLECT_EVERY
    rest = iter(events)
    many = getattr(stretch, "took_from", None)
    for event in rest:
        kind = event.__class__
        if kind is StageCompleted or kind is StageFailed:
            if stretch is None:
                stretch = begun(current)
                many = getattr(stretch, "took_from", None)
            if many is not None:  # a `LongStretch`: it takes the outcomes that follow too
                after = many(event, rest, name, tick)
                if after is None:
                    break
                current, stretch, many = apply(stretch.made(), after), None, None  # type: ignore[union-attr]
            elif stretch is not None:
                try:
                    taken = stretch.took(event)
                except Exception as error:
                    raise ProjectionError(name, event, error) from error
                if not taken:  # the handler's own case: `apply` from the state so far
                    current, stretch = apply(stretch.made(), event), None
            else:
                current = apply(current, event)
        else:
            if stretch is not None:
                current, stretch, many = stretch.made(), None, None
            current = apply(current, event)
        left -= 1
        if not left:
            tick()
            left = every
    return current, stretch
