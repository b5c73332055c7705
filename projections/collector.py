"""Slowing the cyclic garbage collector down around long folds, when nothing else runs."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator

COLLECT_EVERY = 10_000
"""Events between two young-generation collections while the collector is slowed down."""
FEW = 64
"""Folds of at most this many events (a point-in-time question) leave the collector be:
they allocate too little for it to run, and slowing it costs more than the fold."""
FOLD_THRESHOLD = 200_000
"""Allocations between two automatic young collections during a long fold (Python's: 700)."""

_slowed = threading.Lock()
"""Held by the one fold that changed the thresholds, so a nested fold leaves them be."""


@contextlib.contextmanager
def collector_paused() -> Iterator[Callable[[], None]]:
    """Slow the cyclic collector down around a fold, if no other thread runs; yield a `tick`.

    A fold allocates a few acyclic objects per event beside a growing state; the
    collector rescanning that state every 700 allocations costs a rebuild a third
    to a half of its time. The young generation's threshold is raised for the
    fold only, and only in a process with no other thread (a follower, a viewer,
    a user's worker), since the threshold is the whole process's: elsewhere the
    collector is left exactly as it was. Reference counting still frees
    everything at once, the collector still runs on its own every
    `FOLD_THRESHOLD` allocations, and the fold calls `tick` every `COLLECT_EVERY`
    events (a countdown of its own: no call per event), which runs a young
    collection, so a handler that creates cycles piles up no garbage.
    """
    if (
        not gc.isenabled()  # paused by the caller: leave it to them
        or threading.active_count() > 1
        or not _slowed.acquire(blocking=False)
    ):
        yield no_tick
        return

    def tick() -> None:
        gc.collect(0)

    thresholds = gc.get_threshold()
    gc.set_threshold(FOLD_THRESHOLD, *thresholds[1:])
    try:
        yield tick
    finally:
        gc.set_threshold(*thresholds)
        _slowed.release()


def no_tick() -> None:
    """The `tick` of a fold that leaves the collector as it is (called every `COLLECT_EVERY`)."""
