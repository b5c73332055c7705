"""Pausing the cyclic garbage collector around long folds."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

COLLECT_EVERY = 10_000
"""Events between two young-generation collections while the collector is paused."""
FEW = 64
"""Folds of at most this many events (a point-in-time question) leave the collector be:
they allocate too little for it to run, and pausing it costs more than the fold."""


@contextlib.contextmanager
def collector_paused() -> Iterator[Callable[[], None]]:
    """Pause the cyclic garbage collector around a fold; yield a per-event `tick`.

    A fold allocates a few acyclic objects per event beside a growing state; the
    collector rescanning that state every 700 allocations costs a fold a quarter to
    a half of its time. Reference counting still frees everything at once, and
    `tick` runs a young-generation collection every `COLLECT_EVERY` events, so a
    handler that does create cycles cannot pile garbage up for a whole long run.
    """
    if not gc.isenabled():  # paused by the caller already: leave it to them
        yield no_tick
        return
    count = 0

    def tick() -> None:
        nonlocal count
        count += 1
        if count % COLLECT_EVERY == 0:
            gc.collect(0)

    gc.disable()
    try:
        yield tick
    finally:
        gc.enable()


def no_tick() -> None:
    """The `tick` of a fold that does not pause the collector."""
