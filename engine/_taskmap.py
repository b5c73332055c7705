"""An immutable task-status map whose update costs about the same at any size.

A run's machine state is a frozen value replaced at every event. Copying a plain
dict of every task's status on each task event would make a coordinator with
100,000 tasks quadratic; this map copies one small bucket and two 32-slot
tuples instead (a two-level hash trie).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

_FANOUT = 32
_Buckets = tuple[tuple[dict[str, str], ...], ...]
_EMPTY: _Buckets = tuple(tuple({} for _ in range(_FANOUT)) for _ in range(_FANOUT))


class TaskStatuses(Mapping[str, str]):
    """Task id → status (pending, active, completed, failed); `set` returns a new map."""

    __slots__ = ("_buckets", "_size")

    def __init__(self, buckets: _Buckets = _EMPTY, size: int = 0) -> None:
        self._buckets = buckets
        self._size = size

    def set(self, task_id: str, status: str) -> TaskStatuses:
        """A map like this one with `task_id` at `status`."""
        outer, inner = _slot(task_id)
        row = self._buckets[outer]
        bucket = dict(row[inner])
        added = task_id not in bucket
        bucket[task_id] = status
        row = (*row[:inner], bucket, *row[inner + 1 :])
        buckets = (*self._buckets[:outer], row, *self._buckets[outer + 1 :])
        return TaskStatuses(buckets, self._size + added)

    def __getitem__(self, task_id: str) -> str:
        outer, inner = _slot(task_id)
        return self._buckets[outer][inner][task_id]

    def __iter__(self) -> Iterator[str]:
        for row in self._buckets:
            for bucket in row:
                yield from bucket

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"TaskStatuses({dict(self)!r})"


def _slot(task_id: str) -> tuple[int, int]:
    code = hash(task_id)
    return (code >> 5) & (_FANOUT - 1), code & (_FANOUT - 1)
