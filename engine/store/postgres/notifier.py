"""Waking a PostgreSQL store's followers after appends, at most one NOTIFY per interval.

A NOTIFY is a transaction of its own (one inside the append's would serialise
every commit: PostgreSQL holds a global lock from a notifying transaction's
commit until it ends), so sending one after every append costs each append a
statement on the client and a transaction on the server, and wakes every
follower once per append. A follower reads everything committed when it wakes,
so one NOTIFY after a burst of appends wakes it as well as one after each.

The rule kept: after every append, a NOTIFY is sent that starts after its commit.
The first append of an interval sends it at once; the others of the same interval
leave it to a sender thread, which sends one when the interval is up (at most
`INTERVAL` later than an immediate one would have been). The thread lives while
appends keep coming, and ends after an interval with none: one thread for a stream
of appends, not one per interval (a thread's start and end cost the writer more CPU
than the NOTIFY it sends).

A child process forked from one with an open store starts with no sender, lock or
NOTIFY pending of its parent's (`_after_fork`): the parent's sender sends the
parent's NOTIFY, and a lock held by a parent's thread at the fork would never be
released in the child.
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
        self._forget_parent()
        self.sent = 0
        """NOTIFYs sent (for the tests)."""
        _NOTIFIERS.add(self)

    def _forget_parent(self) -> None:
        """No sender, lock or NOTIFY due: a new notifier's state, or a forked child's
        (see `_after_fork`)."""
        self._lock = threading.Lock()
        self._woken = threading.Condition(self._lock)
        self._sent = float("-inf")
        self._due = False
        """An append since the last NOTIFY waits for the sender's."""
        self._sender: threading.Thread | None = None
        self._started: threading.Thread | None = None  # the last sender, ended or not

    @property
    def due(self) -> bool:
        """Whether an append waits for the NOTIFY that follows it."""
        return self._due

    def appended(self, conn: Any) -> None:
        """An append just committed on `conn`: notify now, or leave it to the sender."""
        now = time.monotonic()
        with self._lock:
            at_once = self._sender is None and now - self._sent >= self.interval
            if not at_once:
                self._due = True
                # a NOTIFY went out less than an interval ago: a sender sends this one
                if self._sender is None and not self._start_sender():
                    at_once, self._due = True, False  # none to be had: sent now
            if at_once:
                self._sent = now
        if at_once:
            self._notify(conn)

    def _start_sender(self) -> bool:
        """Start the sender (the lock held); whether it started (not at interpreter shutdown
        from Python 3.12 on, nor with no thread left to start)."""
        # not a daemon: a process ending unclosed still sends the NOTIFY due (waiting two
        # intervals at most), while its pool is open
        sender = threading.Thread(target=self._send_due, name="stagetrail-notify")
        try:
            sender.start()
        except RuntimeError:
            return False
        self._sender = self._started = sender
        return True

    def _send_due(self) -> None:
        """The sender: when each interval is up, the NOTIFY due (it starts after every append
        that left it to the sender); ends after an interval that left none, or at `close`."""
        me = threading.current_thread()
        while True:
            with self._lock:
                while self._sender is me:
                    left = self._sent + self.interval - time.monotonic()
                    if left <= 0:
                        break
                    self._woken.wait(left)
                if self._sender is not me:  # closed meanwhile: `close` sent the one due
                    return
                if not self._due:  # an interval without an append
                    self._sender = None
                    return
                self._due = False
                self._sent = time.monotonic()
            self._notify(None)

    def close(self) -> None:
        """Send the NOTIFY still due now, before the connections close."""
        with self._lock:
            due, self._due = self._due, False
            self._sender = None
            started = self._started
            self._woken.notify_all()
        if due:
            self._notify(None)
        if started is not None and started is not threading.current_thread():
            started.join()  # a NOTIFY the sender is sending ends before the pool closes

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
