"""Simulated time for the examples: waits are recorded, not slept."""

from __future__ import annotations

import time


class SimulatedTime:
    """A clock that starts now and moves only when something sleeps on it.

    The examples pass it to the supervisor as `clock` and `sleep`, so a demo with
    minutes of back-off and breaker timeouts runs in well under a second.
    """

    def __init__(self) -> None:
        self.now = time.time()
        self.slept = 0.0

    def clock(self) -> float:
        """The simulated time, in seconds since the epoch."""
        return self.now

    def sleep(self, seconds: float) -> None:
        """Let `seconds` pass at once."""
        self.now += seconds
        self.slept += seconds
