"""The persistent map and list: updates that cost about the same at any size.

Projection states are frozen values replaced at every event. Copying a plain
dict or tuple that grows with the run (tasks, signatures, frames) on each event
would make long runs quadratic; these structures copy a small part instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeAlias, TypeVar

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
        # Not `PList(...)`: its __init__ is a second call, and folds push once per event.
        pushed: PList[T] = _new(PList)
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
        for item, tail in self.newest_cells():
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

    @classmethod
    def of_runs(cls, runs: list[tuple[T, int]]) -> PList[T]:
        """The list `runs` wrote, its cells made `RUN_CELLS` at a time when first walked."""
        size = sum(count for _, count in runs)
        return cls(_deferred_runs(list(runs), size), size) if runs else cls()

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
"""Cells `PList.of_runs` makes at a time, newest first."""


def _deferred_runs(runs: list[tuple[T, int]], size: int) -> Deferred[T]:
    def load() -> Cons[T]:
        rest = list(runs)
        items: list[T] = []
        while rest and len(items) < RUN_CELLS:
            item, count = rest.pop()
            take = min(count, RUN_CELLS - len(items))
            items += [item] * take
            if take < count:
                rest.append((item, count - take))
        cells: Cons[T] = _deferred_runs(rest, size - len(items)) if rest else None
        for item in reversed(items):  # items are newest first
            cells = (item, cells)
        return cells

    return Deferred(load, size, about=runs)
