"""The persistent map and list: updates that cost about the same at any size.

Projection states are frozen values replaced at every event. Copying a plain
dict or tuple that grows with the run (tasks, signatures, frames) on each event
would make long runs quadratic; these structures copy a small part instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeAlias, TypeVar

from immutables import Map

T = TypeVar("T")

PMap = Map
"""The persistent map: `immutables.Map`, a hash array mapped trie in C.

`set` returns a new map sharing all but O(log n) nodes with the old one. It
replaced a home-made two-level trie, which it beats at every size measured
(`benchmarks/structures.py`, figures in docs/performance.md). Unlike a dict it
compares equal only to another map: compare ``dict(m) == {...}``.
"""


Cons: TypeAlias = "tuple[T, Cons[T]] | None"


class PList(Generic[T]):
    """An immutable list that shares its past: `push` and `pop` cost O(1)."""

    __slots__ = ("_cells", "_size")

    def __init__(self, cells: Cons[T] = None, size: int = 0) -> None:
        self._cells = cells
        self._size = size

    @classmethod
    def of(cls, items: Iterator[T] | list[T] | tuple[T, ...]) -> PList[T]:
        """A list holding `items`, oldest first."""
        cells: Cons[T] = None
        size = 0
        for item in items:  # cons cells directly: decoding a deep stack builds thousands
            cells, size = (item, cells), size + 1
        return cls(cells, size)

    def push(self, item: T) -> PList[T]:
        """A list with `item` appended (as the newest)."""
        return PList((item, self._cells), self._size + 1)

    def pop(self, count: int = 1) -> PList[T]:
        """A list without its `count` newest items."""
        cells = self._cells
        for _ in range(min(count, self._size)):
            assert cells is not None
            cells = cells[1]
        return PList(cells, max(self._size - count, 0))

    def nth_newest(self, index: int) -> T:
        """The item `index` places from the newest (0: the newest).

        Raises:
            IndexError: the list holds `index` items or fewer.
        """
        cells = self._cells
        for _ in range(index):
            if cells is None:
                break
            cells = cells[1]
        if cells is None or index < 0:
            raise IndexError(f"no item {index} places from the newest of {self._size}")
        return cells[0]

    @property
    def last(self) -> T | None:
        """The newest item, or None when empty."""
        return None if self._cells is None else self._cells[0]

    def newest_first(self) -> Iterator[T]:
        """The items, newest first, without copying."""
        cells = self._cells
        while cells is not None:
            yield cells[0]
            cells = cells[1]

    def to_tuple(self) -> tuple[T, ...]:
        """The items, oldest first."""
        items = list(self.newest_first())
        items.reverse()
        return tuple(items)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[T]:
        return iter(self.to_tuple())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PList) and self.to_tuple() == other.to_tuple()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PList({list(self.to_tuple())!r})"
