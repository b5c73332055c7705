"""Lists of items made from events, stored as the events' versions and made again when walked.

A stack's frames and a stage's attempts are each made from one event of the
run. A time-travel snapshot of such a list holds the versions of those events
as ranges (a list that never lost an item: one range, whatever its length),
and the list restored from it makes its items from their events only when a
walk first reaches them, newest first: `FIRST_READ`, then `ITEMS_PER_READ` at a time.
An event that made several neighbouring items (a hub's implicit route and the
outcome that took it) has its version listed once per item; `make` is told which
of them to make.
"""

from __future__ import annotations

import itertools
import operator
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar, overload

from events import Event
from projections.base import EventSource
from projections.errors import ProjectionStateError
from projections.immutable import Cons, Deferred, PList, RowList

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


def pack_ranges(ranges: Sequence[tuple[int, int]]) -> str:
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


def unpack_ranges(
    text: str, last: int | None = None, count: int | None = None, check: int | None = None
) -> PackedRanges:
    """The ranges `pack_ranges` packed, unpacked only as far as they are walked.

    A restored deep stack needs its newest items only (a slider's move lists the
    newest 100 frames), so `from_events` reads these ranges from their newest end,
    a page at a time; anything else sees the whole list, unpacked once. `last` and
    `count` are their newest version and how many versions they hold, as a snapshot
    stored them (`packed_versions`) with their `ranges_check`: given, the text is not
    read to sum them, only to check that they are its own.

    Raises:
        ProjectionStateError: `last`, `count` or `check` is given without the others, is
            not a natural number, or the totals are not those of `text`.
    """
    if last is None and count is None and check is None:
        return PackedRanges(text)
    if not (_natural(last) and _natural(count) and _natural(check)):
        raise ProjectionStateError(
            "packed ranges",
            f"last, count and check must be ints >= 0, got {last!r}, {count!r} and {check!r}",
        )
    assert last is not None
    assert count is not None
    if ranges_check(text, last, count) != check:
        raise ProjectionStateError(
            "packed ranges",
            f"the stored last {last} and count {count} are not those of the ranges stored "
            "with them: the snapshot is refused",
        )
    return PackedRanges(text, last, count)


def _natural(number: object) -> bool:
    return type(number) is int and number >= 0


def ranges_check(text: str, last: int, count: int) -> int:
    """A checksum binding packed ranges to their stored totals (CRC-32, read in C: a
    hundredth of summing them), so totals that are not the text's are refused, not used."""
    return zlib.crc32(text.encode("ascii"), zlib.crc32(f"{last},{count};".encode("ascii")))


PACKED_KEPT = 8
"""Lists whose packed versions `packed_versions` keeps (by their newest cell), so the next
snapshot of a list grown from one of them packs only the items pushed since: a fold of a
long run storing a view every few thousand events would otherwise walk the whole list each
time (a stack and each stage's attempts: a few lists per run)."""

_packed: dict[int, tuple[object, str, int, int]] = {}
_packed_lock = threading.Lock()


def packed_versions(items: PList[T]) -> tuple[str, int, int]:
    """The versions of `items`' events as `pack_ranges` packs them, the newest and how many.

    A deferred tail (a restored snapshot) is not walked nor unpacked: its packed ranges
    are reused, and only the items made since are packed onto them; so are the packed
    versions of a list packed lately (`PACKED_KEPT`) that this one grew from.
    """
    if isinstance(items, RowList):
        return packed_onto(*_packed_below_tip(items), items.tip_versions())
    newest: list[int] = []
    cells, base = items.cells, ("", 0, 0)
    while cells is not None:
        if type(cells) is Deferred:
            about = cells.about
            if isinstance(about, PackedRanges):
                base = about.packed, about.last, about.versions
            else:
                ranges = list(about)
                base = pack_ranges(ranges), ranges[-1][1] if ranges else 0, cells.size
            break
        known = _packed.get(id(cells))
        if known is not None and known[0] is cells:
            base = known[1:]
            break
        newest.append(cells[0].version)  # type: ignore[index]
        cells = cells[1]  # type: ignore[index]
    packed = packed_onto(*base, newest[::-1])
    if newest and items.cells is not None:
        with _packed_lock:
            _packed[id(items.cells)] = (items.cells, *packed)
            while len(_packed) > PACKED_KEPT:
                del _packed[next(iter(_packed))]
    return packed


def _packed_below_tip(items: RowList[T]) -> tuple[str, int, int]:
    """`packed_versions` of a row list without its newest block: kept by its full blocks,
    which never change, so a long fold's next snapshot packs only the blocks sealed since
    (on the packed versions kept for the blocks below them), not every block again."""
    blocks = items.blocks
    newer: list[Sequence[Any]] = []  # the blocks above the newest ones packed, newest first
    below, base = blocks, None
    while below is not None:
        known = _packed.get(id(below))
        if known is not None and known[0] is below:
            base = known[1:]
            break
        newer.append(below[0])
        below = below[1]
    if not newer and base is not None:
        return base
    if base is None:
        base = packed_versions(items.below)
    step, at = len(items.fields), items.version_at
    packed = packed_onto(*base, [v for rows in reversed(newer) for v in rows[at::step]])
    if blocks is not None:
        with _packed_lock:
            _packed[id(blocks)] = (blocks, *packed)
            while len(_packed) > PACKED_KEPT:
                del _packed[next(iter(_packed))]
    return packed


def forget_packed() -> None:
    """Drop the packed versions kept (`PACKED_KEPT`) and the lists they hold: once runs are
    erased, their items are not kept alive here for a cache no state of theirs can hit."""
    with _packed_lock:
        _packed.clear()


def packed_onto(
    packed: str, last: int, count: int, versions: Sequence[int]
) -> tuple[str, int, int]:
    """`packed` ranges (newest `last`, `count` versions) with `versions` (oldest first) after."""
    if not versions:
        return packed, last, count
    ranges: list[tuple[int, int]] = []
    for version in versions:
        if ranges and ranges[-1][1] + 1 == version:
            ranges[-1] = (ranges[-1][0], version)
        else:
            ranges.append((version, version))
    count += len(versions)
    if packed and ranges[0][0] == last + 1:  # the packed newest range goes on
        start = packed.rfind(",") + 1
        step, _, extra = packed[start:].partition("+")
        low, high = ranges.pop(0)
        packed = f"{packed[:start]}{step}+{int(extra or 0) + high - low + 1}"
        last = high
    parts = []
    for low, high in ranges:
        parts.append(str(low - last) if high == low else f"{low - last}+{high - low}")
        last = high
    if parts:
        packed = ",".join([packed, *parts]) if packed else ",".join(parts)
    return packed, last, count


class PackedRanges(Sequence[tuple[int, int]]):
    """Ranges as `pack_ranges` wrote them, oldest first, unpacked when first read.

    Their count of versions and newest version are summed in C-speed passes; `newest`
    splits off the newest versions by reading the text backwards from its end, so a
    restore of hundreds of thousands of ranges costs a sum, not a tuple per range.
    """

    __slots__ = ("_count", "_end", "_last", "_newest", "_ranges", "_text")

    def __init__(
        self,
        text: str,
        last: int | None = None,
        count: int | None = None,
        *,
        end: int | None = None,
        newest: str = "",
    ) -> None:
        # The ranges are text[:end] + newest: the ranges below a page share the text
        # read (no copy of it per page), `newest` being a range split by the page.
        self._text, self._end, self._newest = text, len(text) if end is None else end, newest
        self._ranges: Ranges | None = None
        if last is None or count is None:
            last, count = _totals(text)
        self._last, self._count = last, count

    @property
    def last(self) -> int:
        """The newest version the ranges hold (0 when they hold none)."""
        return self._last

    @property
    def versions(self) -> int:
        """How many versions the ranges hold."""
        return self._count

    @property
    def packed(self) -> str:
        """The ranges as `pack_ranges` packs them (no range unpacked)."""
        text = self._text[: max(self._end, 0)]
        if self._newest:
            return f"{text},{self._newest}" if text else self._newest
        return text

    def newest(self, most: int) -> tuple[Ranges, PackedRanges | None]:
        """The ranges of the newest `most` versions (oldest first), and the ranges below them."""
        text, end, high, page, taken = self._text, self._end, self._last, [], 0
        token: str | None = self._newest or None
        while (token is not None or end > 0) and taken < most:
            if token is None:  # the next range back in the text
                start = text.rfind(",", 0, end) + 1
                token = text[start:end]
            else:  # the split range after the text's: it begins where the text ends
                start = end + 1
            step, _, extra = token.partition("+")
            low = high - int(extra or 0)
            take = min(high - low + 1, most - taken)
            page.append((high - take + 1, high))
            taken += take
            if take <= high - low:  # the range's older part stays below
                rest = high - take - low
                kept = step if rest == 0 else f"{step}+{rest}"
                below = PackedRanges(
                    text, high - take, self._count - taken, end=start - 1, newest=kept
                )
                return page[::-1], below
            high, end, token = low - int(step), max(start - 1, 0), None
        if end <= 0 and token is None:
            if high != 0 or taken != self._count:  # walked to the oldest: totals are known
                raise ProjectionStateError(
                    "packed ranges",
                    f"their stored totals are not their own: {self._count - taken} more "
                    f"versions and a newest {high} above theirs",
                )
            return page[::-1], None
        return page[::-1], PackedRanges(
            text, high, self._count - taken, end=end, newest=token or ""
        )

    def _unpacked(self) -> Ranges:
        if self._ranges is None:
            self._ranges = _unpack(self.packed)
        return self._ranges

    def __len__(self) -> int:
        return len(self._unpacked())

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[int, int]]: ...

    def __getitem__(self, index: int | slice) -> tuple[int, int] | Sequence[tuple[int, int]]:
        return self._unpacked()[index]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._unpacked())

    def __bool__(self) -> bool:
        return self._count > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedRanges):
            other = other._unpacked()
        return isinstance(other, list) and self._unpacked() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedRanges({self._text[-40:]!r}, last={self._last}, count={self._count})"


def _totals(text: str) -> tuple[int, int]:
    """The newest version of packed ranges and how many versions they hold."""
    if not text:
        return 0, 0
    ranges = text.count(",") + 1
    if "+" not in text:
        return _sum(text), ranges
    # Each range's extra versions follow a "+" (a few ranges: a stack's frames are
    # seldom neighbours); the newest version is every number summed.
    extras = sum(int(part.partition(",")[0]) for part in text.split("+")[1:])
    return _sum(text.replace("+", ",")), ranges + extras


def _sum(text: str) -> int:
    """The sum of comma-separated integers: a restore's largest cost on a long run.

    The same few steps between versions come back again and again (a loop's events),
    so each distinct one is counted (in C) and made an int once: half the time of an
    int per number for a 200,000-event run's attempts. Distinct steps are few whatever
    the run: they add up to at most its last version, so a run of a million events
    has fewer than 1,415 of them.
    """
    return sum(int(number) * times for number, times in Counter(text.split(",")).items())


def _unpack(text: str) -> Ranges:
    """Every range of packed `text`, oldest first."""
    ranges: Ranges = []
    previous = 0
    for part in text.split(",") if text else ():
        step, _, extra = part.partition("+")
        low = previous + int(step)
        previous = low + int(extra or 0)
        ranges.append((low, previous))
    return ranges


def range_items(ranges: Sequence[tuple[int, int]]) -> int:
    """How many versions `ranges` hold."""
    if isinstance(ranges, PackedRanges):
        return ranges.versions
    below: int = sum(itertools.starmap(operator.sub, ranges))  # each low less its high
    return len(ranges) - below


Make = Callable[[Event, int, int], T]
"""Makes the item at `index` (0: the oldest) of the `count` items the list holds of an event."""


def from_events(
    name: str, ranges: Sequence[tuple[int, int]], events: EventSource, make: Make[T]
) -> PList[T]:
    """The list of the items `make` makes from the events of `ranges`, made when first walked.

    A version listed more than once stands for as many neighbouring items of its event.

    Raises (when walked):
        ProjectionStateError: an event of `ranges` is not in the store (named by `name`).
    """
    if not ranges:
        return PList()
    size = range_items(ranges)
    packed = ranges if isinstance(ranges, PackedRanges) else PackedRanges(pack_ranges(ranges))
    return PList.deferred(_deferred(name, packed, size, events, make, FIRST_READ))


def _deferred(
    name: str,
    ranges: PackedRanges,
    size: int,
    events: EventSource,
    make: Make[T],
    per_read: int = ITEMS_PER_READ,
) -> Deferred[T]:
    page, rest = ranges.newest(per_read)
    while rest is not None and rest.last == page[0][0]:  # an event's items on one page
        per_read += 1
        page, rest = ranges.newest(per_read)
    count = size - (0 if rest is None else rest.versions)

    def load() -> Cons[T]:
        wanted = _counts(page)
        # Each span of nearby ranges read alone: frames far apart never read the run between.
        made = [
            make(e, index, wanted[e.version])
            for low, high in _spans(page)
            for e in events(low - 1, high)
            if e.version in wanted
            for index in range(wanted[e.version])
        ]
        if len(made) != count:
            raise ProjectionStateError(name, f"{count - len(made)} events are missing")
        below = _deferred(name, rest, size - count, events, make) if rest else None
        return PList.of(made, below).cells

    return Deferred(load, size, about=ranges)


def _counts(page: Ranges) -> dict[int, int]:
    """How many times each version of the page's ranges is listed (once, unless it made more)."""
    listed = dict.fromkeys(itertools.chain.from_iterable(range(lo, hi + 1) for lo, hi in page), 1)
    if len(listed) == range_items(page):  # no version listed twice: the common case
        return listed
    for version in listed:
        listed[version] = 0
    for low, high in page:
        for version in range(low, high + 1):
            listed[version] += 1
    return listed


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
