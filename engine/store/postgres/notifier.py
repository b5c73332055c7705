"""Waking a PostgreSQL store's followers after appends, at most one NOTIFY per interval.

A NOTIFY is a transaction of its own (one inside the append's would serialise
every commit: PostgreSQL holds a global lock from a notifying transaction's
commit until it ends), so sending one after every append costs each append a
statement on the client and a transaction on the server, and wakes every
follower once per append. A follower reads everything committed when it wakes,
so one NOTIFY after a burst of appends wakes it as well as one after each.

The rule kept: after every append, a NOTIFY is sent that starts after its commit.
The first append of an interval sends it at once; the others of the same interval
leave it to a timer, which sends one when the interval is up (at most `INTERVAL`
later than an immediate one would have been).

A child process forked from one with an open store starts with no timer, lock or
NOTIFY pending of its parent's (`_after_fork`): the parent's timer sends the parent's
NOTIFY, and a lock held by a parent's thread at the fork would never be released in
the child.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)

INTERVAL = 0.02
"""Seconds between two NOTIFYs of one process's appends, at least (a follower wakes that much
later at most)."""

_NOTIFIERS: weakref.WeakSet[Notifier] = weakref.WeakSet()
"""Every notifier of this process, forgotten as its store is."""


class Notifier:
    """Sends the NOTIFY that follows each append, at most one per `interval`.

    Args:
        send: sends one NOTIFY on the connection given (None: a connection of its own).
        interval: seconds between two NOTIFYs at least.
    """

    def __init__(self, send: Callable[[Any], None], interval: float = INTERVAL) -> None:
        self._send = send
        self.interval = interval
        self._lock = threading.Lock()
        self._sent = float("-inf")
        self._timer: threading.Timer | None = None
        self._started: threading.Timer | None = None  # the last timer, fired or not
        self.sent = 0
        """NOTIFYs sent (for the tests)."""
        _NOTIFIERS.add(self)

    def _forget_parent(self) -> None:
        """In a forked child: none of the parent's timer, lock or NOTIFY due (see `_after_fork`)."""
        self._lock = threading.Lock()
        self._sent = float("-inf")
        self._timer = None
        self._started = None

    def appended(self, conn: Any) -> None:
        """An append just committed on `conn`: notify now, or leave it to the timer."""
        now = time.monotonic()
        with self._lock:
            if self._timer is None and now - self._sent >= self.interval:
                self._sent = now
                at_once = True
            else:
                at_once = False
                if self._timer is None:  # a NOTIFY went out less than an interval ago
                    delay = max(self._sent + self.interval - now, 0.0)
                    # not a daemon: a process ending unclosed still sends it (waiting
                    # `interval` at most), while its pool is open
                    self._timer = self._started = threading.Timer(delay, self._fire)
                    self._timer.start()
        if at_once:
            self._notify(conn)

    def _fire(self) -> None:
        """The timer's NOTIFY: it starts after every append that left it to the timer."""
        with self._lock:
            if self._timer is None:  # closed meanwhile, and sent by `close`
                return
            self._timer = None
            self._sent = time.monotonic()
        self._notify(None)

    def close(self) -> None:
        """Send the NOTIFY still due now, before the connections close."""
        with self._lock:
            timer, self._timer = self._timer, None
            started = self._started
        if timer is not None:
            timer.cancel()
            self._notify(None)
        if started is not None and started is not threading.current_thread():
            started.join()  # a NOTIFY the timer is sending ends before the pool closes

    def _notify(self, conn: Any) -> None:
        try:
            self._send(conn)
            self.sent += 1
        except Exception as error:  # a follower waits for its timeout instead
            _log.warning("NOTIFY after an append failed: %s", error)


def _after_fork() -> None:
    """In a forked child: every inherited notifier starts afresh (no thread survives a fork)."""
    for notifier in list(_NOTIFIERS):
        notifier._forget_parent()


os.register_at_fork(after_in_child=_after_fork)
