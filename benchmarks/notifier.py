"""The PostgreSQL notifier's CPU per append: one sender thread against a timer per interval.

A writer appending every millisecond leaves most NOTIFYs to the notifier's thread
(at most one per 20 ms). The notifier as shipped keeps one sender thread while appends
keep coming; the baseline, the one it replaced, started a `threading.Timer` (a thread)
per interval. Each round appends with each notifier and with none (the loop alone),
their send doing nothing, and takes the process CPU of each: what a notifier adds per
append is its CPU less the loop's, and the ratio is taken within the round.

    .venv/bin/python -m benchmarks.notifier            # 16 rounds of 1,000 appends each
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from benchmarks._common import arguments, report
from engine.store.postgres.notifier import INTERVAL, Notifier

GAP = 0.001
"""Seconds between two appends."""


class AppendNotifier(Protocol):
    """What the writer calls: after each append, and at close."""

    def appended(self, conn: Any) -> None:
        """An append just committed."""

    def close(self) -> None:
        """The store closes."""


class TimerNotifier:
    """The baseline: the notifier before the sender thread, one `threading.Timer` per interval."""

    def __init__(self, send: Callable[[Any], None], interval: float = INTERVAL) -> None:
        self._send = send
        self.interval = interval
        self._lock = threading.Lock()
        self._sent = float("-inf")
        self._timer: threading.Timer | None = None
        self._started: threading.Timer | None = None

    def appended(self, conn: Any) -> None:
        """Notify now, or leave it to a timer started for the rest of the interval."""
        now = time.monotonic()
        with self._lock:
            at_once = self._timer is None and now - self._sent >= self.interval
            if at_once:
                self._sent = now
            elif self._timer is None:
                delay = max(self._sent + self.interval - now, 0.0)
                self._timer = self._started = threading.Timer(delay, self._fire)
                self._timer.start()
        if at_once:
            self._send(conn)

    def _fire(self) -> None:
        with self._lock:
            if self._timer is None:
                return
            self._timer = None
            self._sent = time.monotonic()
        self._send(None)

    def close(self) -> None:
        """Send the NOTIFY still due, and wait for the last timer."""
        with self._lock:
            timer, self._timer = self._timer, None
            started = self._started
        if timer is not None:
            timer.cancel()
            self._send(None)
        if started is not None:
            started.join()


class NoNotifier:
    """The loop alone: no NOTIFY at all."""

    def appended(self, conn: Any) -> None:
        """Nothing."""

    def close(self) -> None:
        """Nothing."""


def _nothing(conn: Any) -> None:
    """A send that sends nothing: only the notifier's own cost is measured."""


def cpu_per_append(notifier: AppendNotifier, appends: int) -> float:
    """Process CPU seconds per append of `appends` appends `GAP` apart, closed at the end."""
    start = time.process_time()
    for _ in range(appends):
        notifier.appended(None)
        time.sleep(GAP)
    notifier.close()
    return (time.process_time() - start) / appends


def measure(rounds: int, appends: int) -> dict[str, object]:
    """Median µs of CPU per append each notifier adds to the loop, and the paired ratio."""
    sender, timer, loop, ratios = [], [], [], []
    for _ in range(rounds):
        bare = cpu_per_append(NoNotifier(), appends)
        ours = cpu_per_append(Notifier(_nothing), appends) - bare
        theirs = cpu_per_append(TimerNotifier(_nothing), appends) - bare
        loop.append(bare)
        sender.append(ours)
        timer.append(theirs)
        if theirs > 0:  # a round where noise hid the baseline's cost has no ratio
            ratios.append(ours / theirs)
    return {
        "case": f"notifier CPU per append (us), an append every {GAP * 1000:g} ms",
        "sender_thread": statistics.median(sender) * 1e6,
        "timer_per_interval": statistics.median(timer) * 1e6,
        "loop_alone": statistics.median(loop) * 1e6,
        "ratio": statistics.median(ratios) if ratios else float("nan"),
        "rounds_with_ratio": len(ratios),
        "rounds": rounds,
        "appends": appends,
    }


def main() -> None:
    """Run the rounds and print the figures."""
    args = arguments(__doc__.splitlines()[0] if __doc__ else "notifier")
    rounds, appends = (5, 100) if args.quick else (16, 1000)
    report("PostgreSQL notifier", [measure(rounds, appends)], args.json)


if __name__ == "__main__":
    main()
