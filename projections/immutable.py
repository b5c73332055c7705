"""Immutable maps and lists whose updates cost about the same at any size.

Projection states are frozen values replaced at every event. Copying a plain
dict or tuple that grows with the run (tasks, signatures, frames) on each event
would make long runs quadratic; these structures copy a small part instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, Self, TypeAlias, TypeVar

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

_FANOUT = 32
_Buckets: TypeAlias = "tuple[tuple[dict[object, object], ...], ...]"
_EMPTY: _Buckets = tuple(tuple({} for _ in range(_FANOUT)) for _ in range(_FANOUT))


class PMap(Mapping[K, V]):
    """A two-level hash trie: `set` copies one bucket and two 32-slot tuples."""

    __slots__ = ("_buckets", "_size")

    def __init__(self, buckets: _Buckets = _EMPTY, size: int = 0) -> None:
        self._buckets = buckets
        self._size = size

    @classmethod
    def of(cls, items: Mapping[K, V]) -> PMap[K, V]:
        """A map holding `items`."""
        result: PMap[K, V] = cls()
        for key, value in items.items():
            result = result.set(key, value)
        return result

    def set(self, key: K, value: V) -> Self:
        """A map like this one with `key` mapped to `value`."""
        outer, inner = _slot(key)
        row = self._buckets[outer]
        bucket = dict(row[inner])
        added = key not in bucket
        bucket[key] = value
        row = (*row[:inner], bucket, *row[inner + 1 :])
        buckets = (*self._buckets[:outer], row, *self._buckets[outer + 1 :])
        return type(self)(buckets, self._size + added)

    def __getitem__(self, key: K) -> V:
        outer, inner = _slot(key)
        return self._buckets[outer][inner][key]  # type: ignore[return-value]

    def __iter__(self) -> Iterator[K]:
        for row in self._buckets:
            for bucket in row:
                yield from bucket  # type: ignore[misc]

    def __len__(self) -> int:
        return self._size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"


def _slot(key: object) -> tuple[int, int]:
    code = hash(key)
    return (code >> 5) & (_FANOUT - 1), code & (_FANOUT - 1)


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
