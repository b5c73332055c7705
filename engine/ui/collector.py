"""The viewer process's garbage collector policy: freeze what is cached, collect cycles when idle.

Only `stagetrail ui` installs it (`IdleCollector.serving`); importing `engine.ui` or calling
`create_app` leaves the collector of the importing program as it was.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

IDLE_SECONDS = 1.5
"""How long no request must have been in flight before the viewer collects its cycles."""


class IdleCollector:
    """Moves what the viewer keeps out of full collections, and collects its cycles when idle.

    The viewer keeps folded states of runs in memory, millions of objects for a long run;
    each full (generation-2) collection walks them all, hundreds of milliseconds that land on
    a slider move. After each request `finished` calls `gc.freeze()`: everything alive then
    (the states just cached) goes to the permanent generation, which no automatic collection
    walks; reference counting still frees a state evicted from a cache. Once no request has
    been in flight for `idle` seconds, `collect_if_idle` runs `gc.unfreeze()`, `gc.collect()`,
    `gc.freeze()`, so reference cycles made by requests are freed all the same.
    """

    def __init__(self, idle: float = IDLE_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.idle = idle
        self.clock = clock
        self.collections = 0
        self.swept = threading.Event()
        """Set after each idle collection (for whoever waits for one)."""
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_finished = clock()
        self._unswept = False

    def started(self) -> None:
        """Note a request begun."""
        with self._lock:
            self._in_flight += 1

    def finished(self) -> None:
        """Note a request ended, and freeze what is alive (the states it cached)."""
        with self._lock:
            self._in_flight -= 1
            self._last_finished = self.clock()
            self._unswept = True
            gc.freeze()

    def collect_if_idle(self) -> bool:
        """Collect all generations, frozen ones too, if the viewer is idle; whether it did."""
        with self._lock:
            idle_for = self.clock() - self._last_finished
            if not self._unswept or self._in_flight or idle_for < self.idle:
                return False
            self._unswept = False
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.collections += 1
        self.swept.set()
        return True

    def wrap(self, app: Asgi) -> Asgi:
        """`app`, noting each HTTP request it serves with `started` and `finished`."""

        async def noted(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            self.started()
            try:
                await app(scope, receive, send)
            finally:
                self.finished()

        return noted

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """While inside: a daemon thread calls `collect_if_idle` a few times a second."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(self.idle / 4):
                self.collect_if_idle()

        watcher = threading.Thread(target=watch, name="stagetrail-ui-collector", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()
            gc.unfreeze()
