"""Subclasses of a built-in projection that take outcomes their own way, for the tests that
pin that a built-in's own fast fold gives way to them (`projections.base.folds_with`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar, cast

from events import Event
from projections.base import Projection, on

P = TypeVar("P", bound=Projection[Any])


def ignoring(base: type[P], *kinds: type[Event]) -> tuple[P, P]:
    """Two subclasses of `base` that leave the state as it is on events of `kinds`: one by
    an `@on` handler of its own, one by an `apply` of its own."""

    def ignored(self: P, state: Any, event: Event) -> Any:
        return state

    def apply(self: P, state: Any, event: Event) -> Any:
        return state if isinstance(event, kinds) else base.apply(self, state, event)

    by_handler = type("ByHandler", (base,), {"ignored": on(*kinds)(ignored)})
    by_apply = type("ByApply", (base,), {"apply": apply})
    return cast(P, by_handler()), cast(P, by_apply())


def applied(projection: Projection[Any], events: Iterable[Event], state: Any = None) -> Any:
    """`events` applied one at a time, from `state` (None: the projection's initial state)."""
    if state is None:
        state = projection.initial()
    for event in events:
        state = projection.apply(state, event)
    return state


def prefixes(projection: Projection[Any], events: Iterable[Event]) -> list[Any]:
    """The state after each event, applied one at a time (index 0: the initial state)."""
    states = [projection.initial()]
    for event in events:
        states.append(projection.apply(states[-1], event))
    return states


def assert_folds_as_applied(projection: Projection[Any], start: Any, outcome: Event) -> None:
    """A fold of `outcome` from `start` (a list of it, and an iterator) gives the very state
    `apply` gives: equal to it, and of its class."""
    expected = projection.apply(start, outcome)
    for events in ([outcome], iter([outcome])):
        folded = projection.fold(events, start)
        assert type(folded) is type(expected)
        assert folded == expected
