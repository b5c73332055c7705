"""Lists of items made one per event, stored as the events' versions and made again when walked.

A stack's frames and a stage's attempts are each made from one event of the
run. A time-travel snapshot of such a list holds the versions of those events
as ranges (a list that never lost an item: one range, whatever its length),
and the list restored from it makes its items from their events only when a
walk first reaches them, newest first: `FIRST_READ`, then `ITEMS_PER_READ` at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from events import Event
from projections.base import EventSource
from projections.errors import ProjectionStateError
from projections.immutable import Cons, Deferred, PList

ITEMS_PER_READ = 1000
"""Items a deferred list makes per read of their events, newest first."""
FIRST_READ = 128
"""Items the first read makes: a fold going on from a snapshot (a rollback) or a look at
the newest items (the viewer lists a stack's newest 100 frames) needs only a few, so they
cost a short read, not a page."""

Ranges = list[tuple[int, int]]
"""Versions ``(first, last)``, oldest first."""


class Versioned(Protocol):
    """An item made from the event of this version."""

    @property
    def version(self) -> int:
        """The version of the event it was made from."""


T = TypeVar("T", bound=Versioned)


def version_ranges(items: PList[T]) -> Ranges:
    """The versions of `items`' events as ranges, oldest first (a deferred tail unwalked)."""
    newest: list[int] = []
    ranges: Ranges = []
    for item, tail in items.newest_cells():
        if tail is not None:
            ranges = list(tail.about)
            break
        newest.append(item.version)
    for version in reversed(newest):
        if ranges and ranges[-1][1] + 1 == version:
            ranges[-1] = (ranges[-1][0], version)
        else:
            ranges.append((version, version))
    return ranges


def pack_ranges(ranges: Ranges) -> str:
    """`ranges` as one short string for a snapshot: a range each, oldest first, comma-separated.

    A range is ``d`` or ``d+n``: `d` its first version less the last version of the
    range before it (of 0 for the first), `n` its length less one. A deep stack's
    frames are seldom neighbours (a start between two outcomes), so one range per
    item is common: a few bytes each, not a JSON pair.
    """
    parts = []
    previous = 0
    for low, high in ranges:
        parts.append(str(low - previous) if high == low else f"{low - previous}+{high - low}")
        previous = high
    return ",".join(parts)


def unpack_ranges(text: str) -> Ranges:
    """The ranges `pack_ranges` packed."""
    ranges: Ranges = []
    previous = 0
    for part in text.split(",") if text else ():
        step, _, extra = part.partition("+")
        low = previous + int(step)
        previous = low + int(extra or 0)
        ranges.append((low, previous))
    return ranges


def from_events(
    name: str, ranges: Ranges, events: EventSource, make: Callable[[Event], T]
) -> PList[T]:
    """The list of the items `make` makes from the events of `ranges`, made when first walked.

    Raises (when walked):
        ProjectionStateError: an event of `ranges` is not in the store (named by `name`).
    """
    if not ranges:
        return PList()
    size = sum(high - low + 1 for low, high in ranges)
    return PList.deferred(_deferred(name, list(ranges), size, events, make, FIRST_READ))


def _deferred(
    name: str,
    ranges: Ranges,
    size: int,
    events: EventSource,
    make: Callable[[Event], T],
    per_read: int = ITEMS_PER_READ,
) -> Deferred[T]:
    page: Ranges = []
    rest = list(ranges)
    count = 0
    while rest and count < per_read:
        low, high = rest.pop()
        take = min(high - low + 1, per_read - count)
        page.append((high - take + 1, high))
        if take <= high - low:
            rest.append((low, high - take))
        count += take
    page.reverse()

    def load() -> Cons[T]:
        wanted = {v for low, high in page for v in range(low, high + 1)}
        # Each span of nearby ranges read alone: frames far apart never read the run between.
        made = [
            make(e)
            for low, high in _spans(page)
            for e in events(low - 1, high)
            if e.version in wanted
        ]
        if len(made) != count:
            raise ProjectionStateError(name, f"{count - len(made)} events are missing")
        below = _deferred(name, rest, size - count, events, make) if rest else None
        return PList.of(made, below).cells

    return Deferred(load, size, about=ranges)


SPAN_GAP = 64
"""Ranges closer than this many versions are read in one query (the events between dropped)."""


def _spans(page: Ranges) -> list[tuple[int, int]]:
    """The page's ranges, oldest first, merged where the gap between them is small."""
    spans: list[tuple[int, int]] = []
    for low, high in page:
        if spans and low - spans[-1][1] <= SPAN_GAP:
            spans[-1] = (spans[-1][0], high)
        else:
            spans.append((low, high))
    return spans
