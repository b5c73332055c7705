"""Lists made one item per event: stored as version ranges, made again from events when walked."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from projections import ProjectionStateError, deferred
from projections.deferred import (
    FIRST_READ,
    ITEMS_PER_READ,
    PackedRanges,
    from_events,
    pack_ranges,
    packed_versions,
    ranges_check,
    unpack_ranges,
    version_ranges,
)
from projections.immutable import ROWS_PER_BLOCK, PList, RowList
from tests._helpers import calls_to


@attrs.frozen
class Item:
    """An item made from the event of its version."""

    version: int


@attrs.frozen
class Told:
    """An item made from the event of its version, told its index among the event's `count`."""

    version: int
    index: int
    count: int


class Source:
    """Events 1..`last` (the items' events), counting those read; `missing` are not there."""

    def __init__(self, last: int, missing: frozenset[int] = frozenset()) -> None:
        self.last = last
        self.missing = missing
        self.read = 0

    def __call__(self, gt: int, lte: int) -> Iterator[Any]:
        for version in range(gt + 1, min(lte, self.last) + 1):
            if version not in self.missing:
                self.read += 1
                yield Item(version)


class Items(RowList[Item]):
    """Items kept as rows of their version."""

    __slots__ = ()
    fields = ("version",)

    @staticmethod
    def make(*row: Any) -> Item:
        """The item of `row`."""
        return Item(*row)


def remade(event: Any, index: int = 0, count: int = 1) -> Item:
    """The item of `event` (each of an event's items alike)."""
    return Item(event.version)


class TestVersionRanges:
    def test_ranges_merge_consecutive_versions_and_keep_gaps(self) -> None:
        """Consecutive versions make one range; a gap starts another."""
        items = PList.of([Item(v) for v in (2, 3, 4, 7, 9, 10)])
        assert version_ranges(items) == [(2, 4), (7, 7), (9, 10)]
        assert version_ranges(PList()) == []


class TestFromEvents:
    def test_items_are_made_a_page_at_a_time_newest_first(self) -> None:
        """Nothing is read until walked; the newest item reads one page; all read the rest."""
        ranges = [(1, 2 * ITEMS_PER_READ), (2 * ITEMS_PER_READ + 5, 2 * ITEMS_PER_READ + 9)]
        source = Source(3 * ITEMS_PER_READ)
        items = from_events("p", ranges, source, remade)
        assert len(items) == 2 * ITEMS_PER_READ + 5
        assert source.read == 0
        assert version_ranges(items.push(Item(3 * ITEMS_PER_READ))) == [
            *ranges,
            (3 * ITEMS_PER_READ, 3 * ITEMS_PER_READ),
        ]
        assert source.read == 0
        assert items.last == Item(2 * ITEMS_PER_READ + 9)
        assert source.read == FIRST_READ + 4  # the newest items' span, the gap's 4 included
        assert items.nth_newest(FIRST_READ).version == 2 * ITEMS_PER_READ + 9 - FIRST_READ - 4
        assert source.read == FIRST_READ + 4 + ITEMS_PER_READ
        expected = [
            *range(1, 2 * ITEMS_PER_READ + 1),
            *range(2 * ITEMS_PER_READ + 5, 2 * ITEMS_PER_READ + 10),
        ]
        assert [item.version for item in items.to_tuple()] == expected

    def test_items_far_apart_read_only_their_own_events(self) -> None:
        """Items thousands of versions apart are read alone, never the run between them."""
        ranges = [(v, v) for v in range(10_000, 10_000 * (FIRST_READ + 1), 10_000)]
        source = Source(10_000 * FIRST_READ)
        items = from_events("stack", ranges, source, remade)
        assert [item.version for item in items.to_tuple()] == [low for low, _ in ranges]
        assert source.read == FIRST_READ

    def test_a_version_listed_twice_makes_two_items_read_on_one_page(self) -> None:
        """An event listed once per item it made is made into each, told its index and their
        count; the page a first read would end between the two takes both."""
        pairs = FIRST_READ
        versions = [v for v in range(1, pairs + 1) for _ in range(2)] + [pairs + 1]
        ranges = version_ranges(PList.of([Item(v) for v in versions]))
        assert ranges[:3] == [(1, 1), (1, 2), (2, 3)]  # a version again starts a range
        assert unpack_ranges(pack_ranges(ranges)) == ranges
        source = Source(pairs + 1)
        made = from_events("stack", ranges, source, lambda e, i, n: Told(e.version, i, n))
        assert made.last == Told(pairs + 1, 0, 1)
        assert source.read == FIRST_READ // 2 + 1  # the newest 127 items, and the 128th's pair
        expected = [Told(v, i, 2) for v in range(1, pairs + 1) for i in (0, 1)]
        expected.append(Told(pairs + 1, 0, 1))
        assert list(made.to_tuple()) == expected

    def test_a_missing_event_is_named_when_walked(self) -> None:
        """An item whose event is gone raises, naming the projection, rather than shift the list."""
        items = from_events("stack", [(1, 10)], Source(10, frozenset({4})), remade)
        with pytest.raises(ProjectionStateError, match="stack"):
            items.to_tuple()


class TestPackedRanges:
    @pytest.mark.parametrize(
        "ranges",
        [[], [(1, 1)], [(3, 7)], [(2, 2), (6, 6), (9, 12), (100, 100)], [(5, 5), (6, 9)]],
    )
    def test_unpack_gives_back_what_was_packed(self, ranges: list[tuple[int, int]]) -> None:
        """Packing and unpacking any ranges, oldest first, gives the same ranges."""
        assert unpack_ranges(pack_ranges(ranges)) == ranges

    def test_single_versions_take_a_few_bytes(self) -> None:
        """Versions four apart (a stack's frames) take two bytes each, not a JSON pair."""
        ranges = [(v, v) for v in range(4, 40_004, 4)]
        assert pack_ranges(ranges) == ",".join(["4"] * 10_000)
        assert pack_ranges([(10, 12), (20, 20)]) == "10+2,8"


_RANGES = st.lists(st.tuples(st.integers(1, 5), st.sampled_from([0, 0, 1, 3])), max_size=30).map(
    lambda steps: [(low, low + extra) for low, extra in _absolute(steps)]
)


def _absolute(steps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges from (gap, extra) steps: each starts `gap` after the one before ends."""
    made, previous = [], 0
    for gap, extra in steps:
        made.append((previous + gap, extra))
        previous += gap + extra
    return made


class TestNewestRanges:
    @given(_RANGES)
    def test_any_ranges_count_their_versions_and_end_at_their_newest(
        self, ranges: list[tuple[int, int]]
    ) -> None:
        """Packed ranges, with or without ranges of several versions, count every version they
        hold, and their newest version is the last range's end."""
        packed = unpack_ranges(pack_ranges(ranges))
        assert packed.versions == sum(high - low + 1 for low, high in ranges)
        if ranges:
            assert packed.newest(1)[0] == [(ranges[-1][1], ranges[-1][1])]

    @given(_RANGES, st.integers(1, 7))
    def test_pages_from_the_newest_end_hold_every_version_once(
        self, ranges: list[tuple[int, int]], most: int
    ) -> None:
        """Splitting packed ranges `most` versions at a time, newest first, gives every
        version once, and what is left below each page is exactly the older versions."""
        versions = [v for low, high in ranges for v in range(low, high + 1)]
        packed = PackedRanges(pack_ranges(ranges))
        assert packed.versions == len(versions)
        left: PackedRanges | None = packed
        walked: list[int] = []
        while left:
            page, left = left.newest(most)
            walked[:0] = [v for low, high in page for v in range(low, high + 1)]
            older = [] if left is None else [v for low, high in left for v in range(low, high + 1)]
            assert older == versions[: len(versions) - len(walked)]
            assert (0 if left is None else left.versions) == len(older)
        assert walked == versions

    def test_a_restored_list_unpacks_only_the_ranges_it_walks(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A deep list restored from packed ranges shows its newest items without turning
        every range into a tuple (a restore at a slider's move stays cheap at any depth)."""
        ranges = [(v, v) for v in range(4, 4 * 100_001, 4)]
        source = Source(4 * 100_000)

        def whole(text: str) -> list[tuple[int, int]]:
            raise AssertionError("every range was unpacked")

        monkeypatch.setattr(deferred, "_unpack", whole)
        items = from_events("stack", unpack_ranges(pack_ranges(ranges)), source, remade)
        assert len(items) == 100_000
        newest = itertools.islice(items.newest_first(), 3)
        assert [item.version for item in newest] == [400_000, 399_996, 399_992]
        assert items.nth_newest(FIRST_READ).version == 4 * (100_000 - FIRST_READ)


class TestStoredTotals:
    @given(_RANGES, st.integers(0, 40))
    def test_packed_versions_of_a_list_are_its_ranges_packed_with_their_totals(
        self, ranges: list[tuple[int, int]], newer: int
    ) -> None:
        """A list restored from packed ranges, with items pushed since, packs to its items'
        versions, with the newest version and the count a recount would sum."""
        items = from_events("stack", PackedRanges(pack_ranges(ranges)), Source(10_000), remade)
        top = ranges[-1][1] if ranges else 0
        for version in range(top + 1, top + 1 + newer):
            items = items.push(Item(version))
        packed, last, count = packed_versions(items)
        recounted = PackedRanges(packed)
        held = [v for low, high in recounted for v in range(low, high + 1)]
        assert held == [item.version for item in items.to_tuple()]
        assert (last, count) == (recounted.last, recounted.versions)

    def test_a_snapshot_of_a_restored_list_does_not_unpack_it(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Packing a restored deep list (a snapshot taken after a restore) reuses its packed
        text: no range is unpacked and its totals are not summed again."""
        text = pack_ranges([(v, v) for v in range(4, 4 * 100_001, 4)])
        check = ranges_check(text, 400_000, 100_000)
        ranges = unpack_ranges(text, 400_000, 100_000, check)
        items = from_events("stack", ranges, Source(1), remade)

        def refused(text: str) -> Any:
            raise AssertionError("the packed text was read again")

        monkeypatch.setattr(deferred, "_unpack", refused)
        monkeypatch.setattr(deferred, "_totals", refused)
        assert packed_versions(items.push(Item(400_003))) == (text + ",3", 400_003, 100_001)

    @given(_RANGES)
    def test_ranges_unpacked_with_stored_totals_equal_those_recounted(
        self, ranges: list[tuple[int, int]]
    ) -> None:
        """The old restore (totals summed from the text) and the new one (totals as stored)
        give equal ranges, newest version, count and pages."""
        text = pack_ranges(ranges)
        old = unpack_ranges(text)
        new = unpack_ranges(
            text, old.last, old.versions, ranges_check(text, old.last, old.versions)
        )
        assert (new.last, new.versions, list(new)) == (old.last, old.versions, list(old))
        assert new.newest(3)[0] == old.newest(3)[0]

    @pytest.mark.parametrize(
        ("last", "count", "check"),
        [(5, None, None), (None, 2, None), (5, 2, None), (-1, 2, 0), (3, "2", 0), (3, 2, -1)],
    )
    def test_partial_or_bad_totals_are_refused(self, last: Any, count: Any, check: Any) -> None:
        """Totals must come together with their check, as natural numbers: anything else is
        one clear error."""
        with pytest.raises(ProjectionStateError, match="last, count and check"):
            unpack_ranges("1,2", last, count, check)

    @given(_RANGES, st.integers(-3, 3), st.integers(-3, 3))
    def test_totals_that_are_not_the_ranges_own_are_refused(
        self, ranges: list[tuple[int, int]], more_last: int, more_count: int
    ) -> None:
        """Stored totals other than those of the text stored with them (tampered, or the text
        made again on another base) are refused, never used to walk the ranges."""
        text = pack_ranges(ranges)
        right = PackedRanges(text)
        last, count = right.last + more_last, right.versions + more_count
        if (more_last, more_count) == (0, 0) or min(last, count) < 0:
            return
        with pytest.raises(ProjectionStateError, match="not those of the ranges"):
            unpack_ranges(text, last, count, ranges_check(text, right.last, right.versions))
        with pytest.raises(ProjectionStateError, match="not those of the ranges"):
            unpack_ranges(text + ",1", last, count, ranges_check(text, last, count))

    @given(_RANGES.filter(bool), st.integers(1, 3), st.integers(1, 5))
    def test_a_walk_to_the_oldest_range_refuses_totals_not_their_own(
        self, ranges: list[tuple[int, int]], more_last: int, most: int
    ) -> None:
        """Totals wrong from the start (a writer's mistake, which no check stored with them
        can catch) are refused when the walk reaches the oldest range, not used to the end."""
        text = pack_ranges(ranges)
        right = PackedRanges(text)
        for wrong in (
            PackedRanges(text, right.last + more_last, right.versions),
            PackedRanges(text, right.last, right.versions + more_last),
        ):
            rest: PackedRanges | None = wrong
            with pytest.raises(ProjectionStateError, match="not their own"):
                while rest is not None:
                    rest = rest.newest(most)[1]

    def test_a_list_grown_from_one_packed_lately_packs_only_its_new_items(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Packing a list pushed onto since it was last packed (a fold storing a view every few
        thousand events) reads only the new items' versions, and gives what packing it
        afresh gives."""
        read: list[int] = []

        class Counted:
            """An item whose version reads are counted."""

            def __init__(self, version: int) -> None:
                self._version = version

            @property
            def version(self) -> int:
                read.append(self._version)
                return self._version

        items = PList.of([Counted(v) for v in range(2, 2_002, 2)])
        assert packed_versions(items) == (
            pack_ranges([(v, v) for v in range(2, 2_002, 2)]),
            2_000,
            1_000,
        )
        read.clear()
        grown = items.push(Counted(2_001)).push(Counted(2_005))
        packed = packed_versions(grown)
        assert sorted(read) == [2_001, 2_005]
        monkeypatch.setattr(deferred, "_packed", {})
        assert packed_versions(grown) == packed
        assert packed == (
            pack_ranges([*((v, v) for v in range(2, 2_000, 2)), (2_000, 2_001), (2_005, 2_005)]),
            2_005,
            1_002,
        )

    def test_a_row_list_grown_by_blocks_packs_only_the_blocks_sealed_since(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Packing a row list every few blocks (a fold storing a view every 500 events) packs
        only the versions of the blocks sealed since the last packing, and gives what packing
        it afresh gives."""
        packed = calls_to(monkeypatch, deferred, "packed_onto")
        rows: RowList[Item] = Items()
        every, times = 4 * ROWS_PER_BLOCK + 12, 40
        for version in range(1, every * times + 1):
            rows = rows.push_row((2 * version,))
            if version % every == 0:
                packed_versions(rows)
        assert sum(len(versions) for *_, versions in packed) <= 2 * every * times
        fresh = packed_versions(rows)
        monkeypatch.setattr(deferred, "_packed", {})
        assert packed_versions(rows) == fresh == packed_versions(PList.of(list(rows.to_tuple())))
