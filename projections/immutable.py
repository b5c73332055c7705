"""The persistent map and list: updates that cost about the same at any size.

Projection states are frozen values replaced at every event. Copying a plain
dict or tuple that grows with the run (tasks, signatures, frames) on each event
would make long runs quadratic; these structures copy a small part instead.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from marshal import dumps, loads
from operator import itemgetter
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar

from immutables import Map

T = TypeVar("T")

PMap = Map
"""The persistent map: `immutables.Map`, a hash array mapped trie in C.

`set` returns a new map sharing all but O(log n) nodes with the old one. It
replaced a home-made two-level trie, which it beats at every size measured
(`benchmarks/structures.py`, figures in docs/performance.md). Unlike a dict it
compares equal only to another map: compare ``dict(m) == {...}``.
"""


Cons: TypeAlias = "tuple[T, Cons[T]] | Deferred[T] | None"
_new = object.__new__


class Deferred(Generic[T]):
    """Older cells of a `PList` made only when first needed (a stored snapshot's deep part).

    `load` gives the cells (which may end in another `Deferred`); it runs at most
    once, under a lock, however many threads walk the list. `about` is what the
    cells stand for, for whoever wrote them (e.g. the versions of a stack's frames),
    so that a snapshot of a list with a deferred tail need not walk that tail.
    """

    __slots__ = ("_cells", "_load", "_lock", "about", "size")

    def __init__(self, load: Callable[[], Cons[T]], size: int, about: Any = None) -> None:
        self._load: Callable[[], Cons[T]] | None = load
        self._cells: Cons[T] = None
        self._lock = threading.Lock()
        self.size = size
        self.about = about

    def cells(self) -> tuple[T, Cons[T]] | None:
        """The cells, made now if they were not yet."""
        if self._load is not None:
            with self._lock:
                if self._load is not None:
                    self._cells = self._load()
                    self._load = None
        return _made(self._cells)


def newest_items(
    cells: Cons[T], stops: Mapping[int, tuple[Any, ...]] | None = None
) -> tuple[list[T], Cons[T], tuple[Any, ...] | None]:
    """The items of `cells`, newest first, down to a deferred tail or to a cell `stops`
    holds; the cells where the walk stopped (None: at the end) and the entry found there.

    `stops` maps a cell's id to an entry whose first item is that very cell (held, so an
    id reused by another cell is never taken for it): what a caller knows below it.
    """
    newest: list[T] = []
    while cells is not None and type(cells) is not Deferred:
        if stops is not None:
            entry = stops.get(id(cells))
            if entry is not None and entry[0] is cells:
                return newest, cells, entry
        newest.append(cells[0])  # type: ignore[index]
        cells = cells[1]  # type: ignore[index]
    return newest, cells, None


def _made(cells: Cons[T]) -> tuple[T, Cons[T]] | None:
    """`cells` with a deferred head made (a deferred tail further down stays deferred)."""
    while type(cells) is Deferred:
        cells = cells.cells()
    return cells  # type: ignore[return-value]


class PList(Generic[T]):
    """An immutable list that shares its past: `push` and `pop` cost O(1).

    Its older cells may be `Deferred`: made when a walk first reaches them.
    """

    __slots__ = ("_cells", "_size")

    def __init__(self, cells: Cons[T] = None, size: int = 0) -> None:
        self._cells = cells
        self._size = size

    @classmethod
    def of(
        cls, items: Iterator[T] | list[T] | tuple[T, ...], below: Deferred[T] | None = None
    ) -> PList[T]:
        """A list holding `items`, oldest first (on top of the cells `below`, if given)."""
        cells: Cons[T] = below
        size = below.size if type(below) is Deferred else 0
        for item in items:  # cons cells directly: decoding a deep stack builds thousands
            cells, size = (item, cells), size + 1
        return cls(cells, size)

    @classmethod
    def deferred(cls, tail: Deferred[T]) -> PList[T]:
        """A list whose cells are all `tail`'s, made when first needed."""
        return cls(tail, tail.size)

    @property
    def cells(self) -> Cons[T]:
        """The list's cells, newest first (for a `Deferred`'s loader)."""
        return self._cells

    def push(self, item: T) -> PList[T]:
        """A list with `item` appended (as the newest)."""
        # Not `PList(...)`: its __init__ is a second call, and folds push once per event;
        # of the list's own class, so a subclass that adds no slots (`StateList`) stays one.
        pushed: PList[T] = _new(self.__class__)
        pushed._cells = (item, self._cells)
        pushed._size = self._size + 1
        return pushed

    def pop(self, count: int = 1) -> PList[T]:
        """A list without its `count` newest items."""
        cells = self._cells
        for _ in range(min(count, self._size)):
            cells = _made(cells)
            assert cells is not None
            cells = cells[1]
        return PList(cells, max(self._size - count, 0))

    def nth_newest(self, index: int) -> T:
        """The item `index` places from the newest (0: the newest).

        Raises:
            IndexError: the list holds `index` items or fewer.
        """
        cells = _made(self._cells)
        for _ in range(index):
            if cells is None:
                break
            cells = _made(cells[1])
        if cells is None or index < 0:
            raise IndexError(f"no item {index} places from the newest of {self._size}")
        return cells[0]

    @property
    def last(self) -> T | None:
        """The newest item, or None when empty."""
        cells = _made(self._cells)
        return None if cells is None else cells[0]

    def newest_first(self) -> Iterator[T]:
        """The items, newest first, without copying."""
        cells = _made(self._cells)
        while cells is not None:
            yield cells[0]
            cells = _made(cells[1])

    def newest_cells(self) -> Iterator[tuple[T, Deferred[T] | None]]:
        """(item, None) for each item made, newest first, then (None, tail) at a deferred tail.

        For a snapshot that stops where the cells are not made (their `about` says
        what they hold) rather than making them.
        """
        cells = self._cells
        while cells is not None:
            if type(cells) is Deferred:
                yield None, cells  # type: ignore[misc]
                return
            yield cells[0], None  # type: ignore[index]
            cells = cells[1]  # type: ignore[index]

    def to_tuple(self) -> tuple[T, ...]:
        """The items, oldest first."""
        items = list(self.newest_first())
        items.reverse()
        return tuple(items)

    def runs(self) -> list[tuple[T, int]]:
        """The items as runs ``(item, count)`` of equal items, oldest first.

        A deferred tail made by `of_runs` is not walked: it knows its runs.
        """
        newest: list[T] = []
        runs: list[tuple[T, int]] = []
        if type(self).newest_cells is PList.newest_cells:  # its cells, walked in one loop
            newest, below, _ = newest_items(self._cells)
            if below is not None:
                runs = list(below.about)  # type: ignore[union-attr]
        else:
            for item, tail in self.newest_cells():
                if tail is not None:
                    runs = list(tail.about)
                    break
                newest.append(item)
        # Equal items counted a group at a time (a writer's snapshot: an interval's outcomes).
        for item, group in itertools.groupby(reversed(newest)):
            count = len(list(group))
            if runs and runs[-1][0] == item:
                runs[-1] = (item, runs[-1][1] + count)
            else:
                runs.append((item, count))
        return runs

    @classmethod
    def of_runs(cls, runs: list[tuple[T, int]]) -> PList[T]:
        """The list `runs` wrote, its cells made `RUN_CELLS` at a time when first walked."""
        if not runs:
            return cls()
        runs = list(runs)  # its parts name it (`SharedRuns`): never changed after
        size = sum(map(itemgetter(1), runs))

        def load() -> Cons[T]:
            # Split into items and counts only when walked: a decoded state may never be.
            items, counts = list(map(itemgetter(0), runs)), list(map(itemgetter(1), runs))
            parts = runs_deferred(
                items,
                counts,
                len(runs),
                counts[-1],
                size,
                lambda end, left, _: SharedRuns(runs, end, left),
            )
            return parts.cells()

        return cls(Deferred(load, size, about=runs), size)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[T]:
        return iter(self.to_tuple())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PList) and self.to_tuple() == other.to_tuple()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PList({list(self.to_tuple())!r})"


RUN_CELLS = 1000
"""Cells `runs_deferred` (`PList.of_runs`) makes at a time, newest first."""


def runs_deferred(
    items: Sequence[T],
    counts: Sequence[int],
    end: int,
    left: int,
    size: int,
    about: Callable[[int, int, int], Any],
    tail: Cons[T] = None,
) -> Deferred[T]:
    """The runs before `end` (oldest first: `items[i]`, `counts[i]` times; the newest with
    only `left` of its items) on top of `tail`, `size` cells in all: made `RUN_CELLS` at a
    time when first walked, newest first.

    Each deferred part's `about` is ``about(end, left, size)`` of the runs and cells it
    holds, so a reader need not walk it: `PList.of_runs` names them by the runs themselves
    (`SharedRuns`), a restored machine stack by the stack it is the base of. Every part
    shares `items` and `counts`, never copied: the parts of a stack of alternating states
    (runs of one) do not each hold a list of the runs below them.
    """

    def load() -> Cons[T]:
        made: list[T] = []
        at, rest = end, left
        while at and len(made) < RUN_CELLS:
            take = min(rest, RUN_CELLS - len(made))
            made += [items[at - 1]] * take
            rest -= take
            if not rest:
                at -= 1
                rest = counts[at - 1] if at else 0
        cells: Cons[T] = tail
        if at:
            cells = runs_deferred(items, counts, at, rest, size - len(made), about, tail)
        for item in reversed(made):  # made newest first
            cells = (item, cells)
        return cells

    return Deferred(load, size, about=about(end, left, size))


class SharedRuns(Generic[T]):
    """The runs ``(item, count)`` before `end` of `runs`, oldest first, the newest with only
    `left` of its items: each part of `PList.of_runs` names its runs so (`PList.runs` reads
    them unwalked), all parts sharing the one list."""

    __slots__ = ("_end", "_left", "_runs")

    def __init__(self, runs: Sequence[tuple[T, int]], end: int, left: int) -> None:
        self._runs, self._end, self._left = runs, end, left

    def __iter__(self) -> Iterator[tuple[T, int]]:
        end = self._end
        if not end:
            return iter(())
        newest = (self._runs[end - 1][0], self._left)
        return itertools.chain(itertools.islice(self._runs, end - 1), (newest,))

    def __len__(self) -> int:
        return self._end

    def __repr__(self) -> str:
        return f"SharedRuns({list(self)!r})"


ROWS_PER_BLOCK = 128
"""Rows a `RowList` keeps in one block: a push after a pop copies at most this many."""


class RowList(PList[T]):
    """A `PList` keeping its newest items as rows of their fields, made into items when read.

    A long fold pushes one item per event, and the cyclic collector walks every item it
    keeps, over and over as they age: an item and its cons cell are two containers per
    event. Here the items' fields go, a row after another, into one list per
    `ROWS_PER_BLOCK` items (one container per block), and `make` builds an item from its
    row when the list is read. The list stays a persistent value: a push appends to the
    newest block only when this list owns its end (no list pushed from the same one did
    yet), else it copies that block (at most `ROWS_PER_BLOCK` rows), so every list made
    keeps the items it had. Items below the rows (a restored snapshot's deferred cells,
    a list it was made `on`, an item `push`ed by hand whose value is no strict JSON, and
    the rows below it) stay `PList` cells.

    A full block is `sealed` as a tuple, its rows' JSON field (`frozen_at`: a result, a
    dict or list the cyclic collector would walk, and every object in it) taken out of
    them into one `marshal` string for the block: a sealed block then holds atoms only,
    which the collector stops tracking at its next collection, so a long fold leaves no
    heap it walks again and again. Reading a sealed block makes its JSON values anew.

    A subclass per kind of item says how: `fields` (the row's, in `make`'s order) and
    `make`; `version_at` is the index of the row's event version (for snapshots),
    `frozen_at` that of its JSON field (-1: none).
    """

    __slots__ = ("_blocks", "_tip", "_used")

    fields: ClassVar[tuple[str, ...]] = ()
    version_at: ClassVar[int] = 0
    frozen_at: ClassVar[int] = -1

    def __init__(self, cells: Cons[T] = None, size: int = 0) -> None:
        # `PList`'s slots set here, not by its `__init__`: one call less for every empty
        # list (each fold of a stack starts with one, a short point-in-time read among them).
        self._cells = cells
        self._size = size
        self._tip: list[Any] = []  # the newest rows' fields, flat; this list owns `_used` of them
        self._used = 0
        self._blocks: Blocks = None  # the full blocks below, newest first

    @staticmethod
    def make(*row: Any) -> T:
        """The item of `row` (a subclass's)."""
        raise NotImplementedError

    @classmethod
    def on(cls, items: PList[T]) -> RowList[T]:
        """A row list of `items` (themselves when they are one of this class)."""
        if type(items) is cls:
            return items
        return cls(items.cells, len(items))

    def push_row(self, row: tuple[Any, ...]) -> RowList[T]:
        """A list with the item of `row` (its `fields`) appended as the newest."""
        tip, used, blocks = self._tip, self._used, self._blocks
        if used == len(row) * ROWS_PER_BLOCK:  # the block is full: it goes below, a new one starts
            # Sealed as a copy: a push from an older list, held up between taking this
            # block and appending to it, may still append (then copy, its check failing);
            # a block no list's newest is can never grow.
            blocks = self.sealed(tip[:used], blocks)
            tip, used = list(row), len(row)
        elif len(tip) == used:
            tip.extend(row)  # at the block's end this list owns: no list has gone on from it
            used += len(row)
            if len(tip) != used:  # another list went on from this one at the same moment
                tip = tip[: used - len(row)]
                tip.extend(row)
        else:  # a list went on from this one already (a pop, then a push): its block is copied
            tip = tip[:used]
            tip.extend(row)
            used += len(row)
        pushed: RowList[T] = _new(self.__class__)
        pushed._cells, pushed._size, pushed._tip = self._cells, self._size + 1, tip
        pushed._used, pushed._blocks = used, blocks
        return pushed

    @classmethod
    def sealed(cls, rows: list[Any], blocks: Blocks) -> Blocks:
        """`blocks` with the full block `rows` on top: a tuple, the values of its JSON field
        in one marshal string beside it (None where marshal refuses one: not JSON, kept as
        it is). `rows` is a copy the caller gives up: its JSON slots are emptied."""
        at, packed = cls.frozen_at, None
        if at >= 0:
            width = len(cls.fields)
            try:
                # Strict JSON is what marshal copies exactly, types and all; format 4 shares
                # an object met twice in the block as the rows did (and repeated keys).
                packed = dumps(rows[at::width], 4)
            except ValueError:
                pass
            else:
                rows[at::width] = [None] * (len(rows) // width)
        return (tuple(rows), blocks, packed)

    def _thawed(self, blocks: tuple[tuple[Any, ...], Blocks, bytes | None]) -> Sequence[Any]:
        """The rows of the newest of `blocks` as they were pushed (JSON values made anew)."""
        rows, _, packed = blocks
        if packed is None:
            return rows
        thawed = list(rows)
        thawed[self.frozen_at :: len(self.fields)] = loads(packed)
        return thawed

    def push(self, item: T) -> RowList[T]:
        """A list with `item` appended (as the newest)."""
        row = tuple([getattr(item, name) for name in self.fields])
        at = self.frozen_at
        if at < 0 or _json_exactly(row[at]):
            return self.push_row(row)
        # An item made by hand, its value no strict JSON: a sealed block would give it back
        # as marshal copies it (a bytearray as bytes, a NaN unequal to the one pushed), so
        # it stays the item pushed, in a cell, the rows below made into cells too.
        return self.__class__((item, self.cells), self._size + 1)

    def pop(self, count: int = 1) -> RowList[T]:
        """A list without its `count` newest items."""
        count, width = min(count, self._size), len(self.fields)
        size, tip, used, blocks = self._size - count, self._tip, self._used, self._blocks
        sealed = None
        while count * width > used and blocks is not None:
            count -= used // width
            sealed, blocks = blocks, blocks[1]
            used = len(sealed[0])
        if count * width <= used:
            if sealed is not None:  # the newest again: its rows as pushed, a list of its own
                tip = list(self._thawed(sealed)[: used - count * width])
            return self._with(self._cells, size, tip, used - count * width, blocks)
        below = self.below.pop(count - used // width)
        return self._with(below.cells, size, [], 0, None)

    def parts(self) -> tuple[Cons[T], int, list[Any], int, Blocks]:
        """The list's cells below its rows, its size, its newest block, the values of that
        block it owns and its full blocks: for a fold that pushes rows in place
        (`of_parts` makes the list back). A block whose end another list owns comes copied,
        so rows appended to it are this list's alone."""
        tip, used = self._tip, self._used
        return self._cells, self._size, tip if len(tip) == used else tip[:used], used, self._blocks

    @classmethod
    def of_parts(
        cls, cells: Cons[T], size: int, tip: list[Any], used: int, blocks: Blocks
    ) -> RowList[T]:
        """The list of `parts` (and of the rows pushed onto them since)."""
        made: RowList[T] = _new(cls)
        made._cells, made._size, made._tip = cells, size, tip
        made._used, made._blocks = used, blocks
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (and copied) with its own rows only: its newest block may go on with the
        # rows of lists pushed from it since, which it does not hold.
        tip = self._tip[: self._used]
        return (self.of_parts, (self._cells, self._size, tip, self._used, self._blocks))

    def _with(
        self, cells: Cons[T], size: int, tip: list[Any], used: int, blocks: Blocks
    ) -> RowList[T]:
        made: RowList[T] = _new(self.__class__)
        made._cells, made._size, made._tip = cells, size, tip
        made._used, made._blocks = used, blocks
        return made

    def _rows_newest_first(self) -> Iterator[Sequence[Any]]:
        """Each row's fields, newest first."""
        width = len(self.fields)
        tip: Sequence[Any] = self._tip
        used, blocks = self._used, self._blocks
        while True:
            for end in range(used, 0, -width):
                yield tip[end - width : end]
            if blocks is None:
                return
            tip, blocks = self._thawed(blocks), blocks[1]
            used = len(tip)

    @property
    def below(self) -> PList[T]:
        """The items below the rows, as a `PList` (a restored snapshot's deferred cells)."""
        rows = self._used // max(len(self.fields), 1)
        blocks = self._blocks
        while blocks is not None:
            rows += len(blocks[0]) // len(self.fields)
            blocks = blocks[1]
        return PList(self._cells, self._size - rows)

    @property
    def blocks(self) -> Blocks:
        """The full blocks of rows below the newest, newest first (for incremental snapshots)."""
        return self._blocks

    def tip_versions(self) -> list[int]:
        """The event versions of the newest block's rows, oldest first (no item made)."""
        return self._tip[self.version_at : self._used : len(self.fields)]

    def block_versions(self) -> list[int]:
        """The event versions of the full blocks' rows, oldest first (no item made)."""
        step, at = len(self.fields), self.version_at
        parts, blocks = [], self._blocks
        while blocks is not None:
            parts.append(blocks[0][at::step])
            blocks = blocks[1]
        return [version for part in reversed(parts) for version in part]

    @property
    def cells(self) -> Cons[T]:
        """The list's cells, newest first, its rows made into items."""
        cells = self._cells
        for row in reversed(list(self._rows_newest_first())):
            cells = (self.make(*row), cells)
        return cells

    def nth_newest(self, index: int) -> T:
        """The item `index` places from the newest (0: the newest).

        Raises:
            IndexError: the list holds `index` items or fewer.
        """
        if 0 <= index < self._size:
            for at, item in enumerate(self.newest_first()):
                if at == index:
                    return item
        raise IndexError(f"no item {index} places from the newest of {self._size}")

    @property
    def last(self) -> T | None:
        """The newest item, or None when empty."""
        used, width = self._used, len(self.fields)
        if used:
            return self.make(*self._tip[used - width : used])
        if self._blocks is not None:
            return self.make(*self._thawed(self._blocks)[-width:])
        return PList(self._cells, self._size).last

    def newest_first(self) -> Iterator[T]:
        """The items, newest first, without copying."""
        make = self.make
        for row in self._rows_newest_first():
            yield make(*row)
        yield from self.below.newest_first()

    def newest_cells(self) -> Iterator[tuple[T, Deferred[T] | None]]:
        """(item, None) for each item made, newest first, then (None, tail) at a deferred tail."""
        make = self.make
        for row in self._rows_newest_first():
            yield make(*row), None
        yield from self.below.newest_cells()


def _json_exactly(value: Any) -> bool:
    """Whether `value` is strict JSON of exact types (None, bool, int, str, a float not NaN,
    lists, dicts of str keys): what marshal gives back equal, types and all."""
    kind = type(value)
    if kind in _ATOMS:
        return True
    if kind is float:
        return value == value  # type: ignore[no-any-return]
    try:
        if kind is list:
            return all(map(_json_exactly, value))
        if kind is dict:
            keys = all(type(key) is str for key in value)
            return keys and all(map(_json_exactly, value.values()))
    except RecursionError:  # nested too deeply (or holding itself): kept as it is
        pass
    return False


_ATOMS = frozenset({str, int, bool, type(None)})


Blocks: TypeAlias = "tuple[tuple[Any, ...], Blocks, bytes | None] | None"
"""A `RowList`'s full blocks of rows, newest first: each `RowList.sealed`, its JSON values
apart (or None)."""
