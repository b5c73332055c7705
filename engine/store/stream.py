"""A run's events as a store streams them: read a page at a time, decoded as they are taken."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

from events import Event

Reader = Callable[[frozenset[str] | None], Iterator[Event]]
"""Reads the stream's events, only those of the topics given (None: all)."""


class Stream(Iterator[Event]):
    """An iterator over a run's events that a fold may narrow to the topics it handles.

    Nothing is read before the first event is asked for. Until then `narrowed` gives
    the same stream with only some topics' events decoded (the others are read, and
    checked for holes, but never decoded), which `Projection.fold` asks for with the
    topics its handlers take (`projections.handled_topics`).

    Args:
        read: reads the events (of the topics given, None: all), page by page.
        topics: only the events of these topics (None: all).
    """

    __slots__ = ("_events", "_read", "_topics")

    def __init__(self, read: Reader, topics: frozenset[str] | None = None) -> None:
        self._read = read
        self._topics = topics
        self._events: Iterator[Event] | None = None

    def __iter__(self) -> Iterator[Event]:
        """The events (the reading generator itself: nothing more per event)."""
        events = self._events
        if events is None:
            events = self._events = self._read(self._topics)
        return events

    def __next__(self) -> Event:
        """The next event."""
        return next(iter(self))

    def narrowed(self, topics: Collection[str]) -> Iterator[Event]:
        """The stream with only the events of `topics` (itself once it began to be read)."""
        if self._events is not None:
            return self
        wanted = frozenset(topics)
        return Stream(self._read, wanted if self._topics is None else self._topics & wanted)
