from __future__ import annotations

import gc
import itertools
import pickle
import sys
import tracemalloc
from array import array
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from projections.deferred import packed_versions
from projections.immutable import (
    ROWS_PER_BLOCK,
    RUN_CELLS,
    Cons,
    Deferred,
    PList,
    PMap,
    RowList,
    runs_deferred,
)

updates = st.lists(
    st.tuples(st.text(min_size=1, max_size=6), st.sampled_from(["pending", "active", "done"])),
    max_size=200,
)


class TestPMap:
    @given(updates)
    def test_behaves_like_a_dict(self, changes: list[tuple[str, str]]) -> None:
        """After any updates the map equals a dict given the same updates, in size and items."""
        statuses, expected = PMap[str, str](), {}
        for task_id, status in changes:
            statuses = statuses.set(task_id, status)
            expected[task_id] = status
        assert dict(statuses) == expected
        assert len(statuses) == len(expected)
        assert sorted(statuses) == sorted(expected)
        assert all(statuses.get(key) == value for key, value in expected.items())

    def test_updates_leave_earlier_maps_unchanged(self) -> None:
        """set() returns a new map; the old one still holds the old statuses."""
        before = PMap[str, str]().set("t1", "pending")
        after = before.set("t1", "completed").set("t2", "pending")
        assert dict(before) == {"t1": "pending"}
        assert dict(after) == {"t1": "completed", "t2": "pending"}

    def test_missing_tasks(self) -> None:
        """A task never set is absent: get() gives the default, `in` is False."""
        statuses = PMap[str, str]().set("t1", "pending")
        assert statuses.get("nope") is None
        assert "nope" not in statuses


class TestDeferredCells:
    @given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 2_500)), max_size=6))
    def test_a_list_of_runs_holds_their_items_and_gives_them_back(
        self, runs: list[tuple[str, int]]
    ) -> None:
        """`of_runs` holds the items its runs stand for; `runs` gives them back, merged."""
        items = [item for item, count in runs for _ in range(count)]
        plist = PList.of_runs(runs)
        assert len(plist) == len(items)
        assert [item for item, count in plist.runs() for _ in range(count)] == items
        assert plist.to_tuple() == tuple(items)
        merged = PList.of(items).runs()
        assert all(a[0] != b[0] for a, b in itertools.pairwise(merged))

    def test_cells_are_made_a_page_at_a_time_when_first_walked(self) -> None:
        """Reading the newest item makes one page of cells; a push and runs() make none."""
        made: list[int] = []

        def load() -> Any:
            made.append(1)
            return PList.of(["x"] * 3)._cells

        plist: PList[str] = PList.deferred(Deferred(load, 3, about=[("x", 3)])).push("y")
        assert plist.runs() == [("x", 3), ("y", 1)]
        assert made == []
        assert plist.pop().last == "x"
        assert made == [1]
        big = PList.of_runs([("a", 3 * RUN_CELLS)])
        assert big.pop(RUN_CELLS + 1).nth_newest(0) == "a"
        assert len(big.pop(RUN_CELLS + 1)) == 2 * RUN_CELLS - 1


def deferred_parts(cells: Cons[Any]) -> list[Deferred[Any]]:
    """Every deferred part of `cells`, newest first, each made as the walk reaches it."""
    parts: list[Deferred[Any]] = []
    while cells is not None:
        if type(cells) is Deferred:
            parts.append(cells)
            cells = cells.cells()
        else:
            cells = cells[1]  # type: ignore[index]
    return parts


class TestRunsDeferred:
    @given(
        st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 2_500)), min_size=1, max_size=5),
        st.integers(1, 2_500),
        st.lists(st.sampled_from("xy"), max_size=3),
    )
    def test_the_runs_lie_on_the_tail_each_part_named_by_what_it_holds(
        self, runs: list[tuple[str, int]], left: int, tail: list[str]
    ) -> None:
        """The cells are the runs (the newest cut to `left`) on the tail, a part every
        `RUN_CELLS`, each named by `about` of its end, left and size, and of that size."""
        items, counts = [item for item, _ in runs], array("q", [count for _, count in runs])
        left = min(left, counts[-1])
        above = sum(counts[:-1]) + left
        below = PList.of(tail)
        made = runs_deferred(
            items, counts, len(runs), left, above + len(tail), lambda *about: about, below.cells
        )
        plist = PList.deferred(made)
        written = [item for item, count in runs[:-1] for _ in range(count)] + [items[-1]] * left
        assert plist.to_tuple() == (*tail, *written)
        parts = deferred_parts(made)
        assert len(parts) == -(-above // RUN_CELLS)
        for index, part in enumerate(parts):
            end, cut, size = part.about
            assert size == part.size == above + len(tail) - index * RUN_CELLS
            assert sum(counts[: end - 1]) + cut + len(tail) == size

    @given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 2_500)), max_size=6))
    def test_each_part_of_a_list_of_runs_knows_its_runs(self, runs: list[tuple[str, int]]) -> None:
        """Each deferred part of `of_runs`, however deep, names the runs it holds, unwalked."""
        for part in deferred_parts(PList.of_runs(runs).cells):
            held = [item for item, count in part.about for _ in range(count)]
            assert tuple(held) == PList.deferred(part).to_tuple()

    def test_a_walked_list_of_runs_keeps_no_copy_of_them_per_part(self) -> None:
        """A list of 50 parts of runs of one, walked, holds its cells and the runs once:
        not each part's runs below it (25 times the runs)."""
        runs = [("ab"[index % 2], 1) for index in range(50 * RUN_CELLS)]
        gc.collect()
        tracemalloc.start()
        try:
            plist = PList.of_runs(runs)
            assert len(plist.to_tuple()) == len(runs)
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert len(plist) == len(runs)
        cell = sys.getsizeof(("a", None))
        assert held < 2 * cell * len(runs), held


def runs_as_before(plist: PList[Any]) -> list[tuple[Any, int]]:
    """`PList.runs` as it was written before its one-loop walk: an item at a time."""
    newest: list[Any] = []
    runs: list[tuple[Any, int]] = []
    for item, tail in plist.newest_cells():
        if tail is not None:
            runs = list(tail.about)
            break
        newest.append(item)
    for item in reversed(newest):
        if runs and runs[-1][0] == item:
            runs[-1] = (item, runs[-1][1] + 1)
        else:
            runs.append((item, 1))
    return runs


class Names(RowList[str]):
    """Names kept as rows (a `RowList` over a plain list's cells, for `runs`)."""

    __slots__ = ()
    fields = ("name",)

    @staticmethod
    def make(*row: Any) -> str:
        """The name of `row`."""
        return str(row[0])


class TestRuns:
    @given(
        st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 2_500)), max_size=4),
        st.lists(st.one_of(st.sampled_from("abc"), st.integers(0, 4)), max_size=40),
    )
    def test_runs_are_what_an_item_at_a_time_counted(
        self, tail: list[tuple[str, int]], steps: list[str | int]
    ) -> None:
        """Over a deferred tail (made or not), with pushes and pops (into the tail too),
        `runs` gives what counting an item at a time gave, and the list's items."""
        lists: list[PList[str]] = [PList[str](), PList.of_runs(tail)]
        for step in steps:
            plist = lists[-1]
            lists.append(plist.pop(step) if isinstance(step, int) else plist.push(step))
        for plist in lists:
            rows = Names.on(plist)
            for walked in (plist, rows, rows.push_row(("a",)), plist):  # the last: cells made
                runs = walked.runs()
                assert runs == runs_as_before(walked)
                assert [item for item, count in runs for _ in range(count)] == list(
                    walked.to_tuple()
                )


class Pair(tuple[int, str]):
    """An item a `RowList` test keeps: a version and a name."""

    @property
    def version(self) -> int:
        """Its event's version."""
        return self[0]

    @property
    def name(self) -> str:
        """Its name."""
        return self[1]


class Pairs(RowList[Pair]):
    """Pairs kept as rows."""

    __slots__ = ()
    fields = ("version", "name")
    version_at = 0

    @staticmethod
    def make(*row: Any) -> Pair:
        """The pair of `row`."""
        return Pair(row)


row_ops = st.lists(
    st.tuples(st.sampled_from(["push", "pop", "back"]), st.integers(0, 300)), max_size=60
)


class TestRowList:
    @given(row_ops, st.integers(0, 3))
    def test_every_list_made_keeps_its_items_like_a_tuple(
        self, ops: list[tuple[str, int]], below: int
    ) -> None:
        """Pushes (of single rows and of runs past a block), pops and pushes onto older
        lists leave every list made holding what a tuple given the same steps holds."""
        start = Pairs.on(PList.of([Pair((n, "old")) for n in range(1, below + 1)]))
        made: list[tuple[RowList[Pair], tuple[Pair, ...]]] = [(start, start.to_tuple())]
        rows, expected = made[0]
        version = 1000
        for op, number in ops:
            if op == "push":
                for _ in range(number % (ROWS_PER_BLOCK + 40) + 1):
                    version += 1
                    rows = rows.push_row((version, f"n{version % 3}"))
                    expected = (*expected, Pair((version, f"n{version % 3}")))
            elif op == "pop":
                rows, expected = rows.pop(number), expected[: max(len(expected) - number, 0)]
            else:  # go on from a list made before
                rows, expected = made[number % len(made)]
            made.append((rows, expected))
        for rows, expected in made:
            assert rows.to_tuple() == expected
            assert len(rows) == len(expected)
            assert rows.last == (expected[-1] if expected else None)
            assert rows == PList.of(list(expected))
            assert packed_versions(rows) == packed_versions(PList.of(list(expected)))

    def test_a_push_after_a_pop_leaves_the_popped_item_in_the_older_list(self) -> None:
        """The newest block is shared until a list goes on from an older one: it is copied."""
        three = Pairs().push_row((1, "a")).push_row((2, "b")).push_row((3, "c"))
        other = three.pop(2).push_row((4, "d"))
        assert [pair.version for pair in three.to_tuple()] == [1, 2, 3]
        assert [pair.version for pair in other.to_tuple()] == [1, 4]

    def test_items_are_made_from_their_rows_when_read(self) -> None:
        """`push` takes an item's fields as its row; reads make an equal item."""
        rows = Pairs().push(Pair((7, "x")))
        assert rows.nth_newest(0) == Pair((7, "x"))
        assert list(rows.newest_cells()) == [(Pair((7, "x")), None)]


class Note(tuple[int, Any]):
    """An item a `RowList` test keeps: a version and a JSON value."""

    @property
    def version(self) -> int:
        """Its event's version."""
        return self[0]

    @property
    def value(self) -> Any:
        """Its JSON value."""
        return self[1]


class Notes(RowList[Note]):
    """Notes kept as rows, their JSON values frozen in sealed blocks."""

    __slots__ = ()
    fields = ("version", "value")
    version_at = 0
    frozen_at = 1

    @staticmethod
    def make(*row: Any) -> Note:
        """The note of `row`."""
        return Note(row)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


def blocks_of(rows: RowList[Any]) -> list[Any]:
    """The sealed blocks of `rows`, newest first."""
    found, blocks = [], rows.blocks
    while blocks is not None:
        found.append(blocks)
        blocks = blocks[1]
    return found


class TestFrozenRows:
    @given(st.lists(st.tuples(st.sampled_from(["push", "pop", "back"]), json_values), max_size=30))
    def test_every_list_made_keeps_its_json_values_like_a_tuple(
        self, ops: list[tuple[str, Any]]
    ) -> None:
        """Pushes of JSON values (each past a block), pops into sealed blocks and pushes onto
        older lists leave every list made holding what a tuple given the same steps holds, of
        the same types, pickled and unpickled too."""
        rows: RowList[Note] = Notes()
        expected: tuple[Note, ...] = ()
        made = [(rows, expected)]
        version = 0
        for op, value in ops:
            if op == "push":
                for _ in range(ROWS_PER_BLOCK + 3):
                    version += 1
                    rows = rows.push_row((version, value))
                    expected = (*expected, Note((version, value)))
            elif op == "pop":
                count = len(repr(value)) * 11
                rows, expected = rows.pop(count), expected[: max(len(expected) - count, 0)]
            else:
                rows, expected = made[len(repr(value)) % len(made)]
            made.append((rows, expected))
        for rows, expected in made:
            for copy in (rows, pickle.loads(pickle.dumps(rows))):
                items = copy.to_tuple()
                assert items == expected
                assert repr(items) == repr(expected)  # 1 stays 1, never 1.0 or True
                assert copy.last == (expected[-1] if expected else None)
                assert packed_versions(copy) == packed_versions(PList.of(list(expected)))

    def test_sealed_blocks_leave_the_collectors_care_and_read_as_fresh_copies(self) -> None:
        """A sealed block of rows holding dicts and lists holds atoms only: the collector
        stops tracking its rows; each read makes the values anew, equal to those pushed."""
        value = {"files": 3, "scores": [0.5, 0.75], "ok": True}
        rows: RowList[Note] = Notes()
        for version in range(1, 3 * ROWS_PER_BLOCK + 2):
            rows = rows.push_row((version, value if version % 2 else [version, None]))
        gc.collect()
        sealed = blocks_of(rows)
        assert len(sealed) == 3
        assert not any(gc.is_tracked(block[0]) for block in sealed)
        oldest = rows.nth_newest(len(rows) - 1)
        assert oldest.value == value
        assert oldest.value is not value
        assert oldest.value is not rows.nth_newest(len(rows) - 1).value

    def test_a_block_holding_what_marshal_refuses_is_kept_as_pushed(self) -> None:
        """A value marshal does not copy (no JSON) stays in its sealed block as it is."""
        odd = [object()]
        rows: RowList[Note] = Notes()
        for version in range(1, ROWS_PER_BLOCK + 2):
            rows = rows.push_row((version, odd if version == 5 else {"n": version}))
        (block,) = blocks_of(rows)
        assert block[2] is None
        assert rows.nth_newest(len(rows) - 5).value is odd
        assert rows.nth_newest(len(rows) - 6).value == {"n": 6}

    @pytest.mark.parametrize(
        "odd", [bytearray(b"x"), memoryview(b"y"), array("b", [1]), [float("nan")], {"n": [b"z"]}]
    )
    def test_a_hand_made_item_marshal_would_not_give_back_is_kept_as_pushed(self, odd: Any) -> None:
        """An item pushed by hand whose value marshal would give back changed (a buffer as
        bytes, a NaN as another, unequal to it) is read back as the very value pushed, its
        list equal to itself, past sealed blocks on either side."""
        rows: RowList[Note] = Notes()
        for version in range(1, 3 * ROWS_PER_BLOCK + 3):
            note = Note((version, odd if version == ROWS_PER_BLOCK + 5 else {"n": version}))
            rows = rows.push(note)
        items = rows.to_tuple()
        assert items[ROWS_PER_BLOCK + 4].value is odd
        assert [item.value for item in items[:4]] == [{"n": n} for n in range(1, 5)]
        assert items == tuple(Note((note.version, note.value)) for note in items)
        assert rows == rows
        assert isinstance(rows.push_row((9999, None)), Notes)
