"""An immutable task-status map whose update costs about the same at any size.

A run's machine state is a frozen value replaced at every event; copying a dict
of every task's status on each task event would make a coordinator with 100,000
tasks quadratic, so statuses live in the projections' hash-trie map.
"""

from __future__ import annotations

from projections._pmap import PMap


class TaskStatuses(PMap[str, str]):
    """Task id → status (pending, active, completed, failed); `set` returns a new map."""

    __slots__ = ()
