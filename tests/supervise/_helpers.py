"""Shared pieces of the supervisor tests: a fake clock and small pipelines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine import Engine, Pipeline, Run
from events import Event

LOOP = Pipeline(
    "loop",
    initial="work",
    transitions=[
        ("work", "failed", "work"),
        ("work", "completed", "done"),
        ("work", "partial", "check"),
        ("check", "completed", "done"),
        ("check", "failed", "work"),
        ("*", "aborted", "aborted"),
    ],
    final=["done", "aborted"],
)
"""A stage that may retry itself, and a check that sends failures back to it."""


class FakeTime:
    """An injectable clock and sleep: sleeping moves the clock, nothing really waits."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def clock(self) -> float:
        """The fake time."""
        return self.now

    def sleep(self, seconds: float) -> None:
        """Record the sleep and move the clock."""
        self.sleeps.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        """Let time pass inside a stage function."""
        self.now += seconds


def failing(times: int, error: BaseException, result: Any = "ok") -> Callable[..., Any]:
    """A function that raises `error` `times` times, then returns `result`."""
    calls = {"n": 0}

    def fn(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= times:
            raise error
        return result

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


def kinds(engine: Engine, run: Run) -> list[str]:
    """The run's event type names, oldest first."""
    return [type(event).__name__ for event in engine.events(run.id)]


def of_type(engine: Engine, run: Run, name: str) -> list[Event]:
    """The run's events of one type."""
    return [event for event in engine.events(run.id) if type(event).__name__ == name]


POLL = Pipeline(
    "poll",
    initial="step",
    transitions=[
        ("step", "completed", "step"),
        ("step", "failed", "step"),
        ("step", "finished", "end"),
    ],
    final=["end"],
)
"""One stage that repeats on success and on failure, for breakers and progress loops."""
