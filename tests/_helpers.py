"""What several test modules share: the review pipeline, PostgreSQL access, small projections."""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any
from uuid import UUID

import pytest
from freezegun import freeze_time

from engine.cli.demo.code_review import REVIEW as CODE_REVIEW
from engine.engine import Engine
from engine.pipeline import Pipeline
from engine.run import Run
from events import DECIDED, Event, StageCompleted, StageFailed
from projections import Projection, on

POSTGRES_URL = os.environ.get(
    "STAGETRAIL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)

REVIEW = CODE_REVIEW
"""The code-review pipeline of the README, as the demo's examples define it."""

HUB_ROWS = [
    ("hub", "a", "a"),
    ("hub", "b", "b"),
    ("hub", "stop", "end"),
    ("a", "completed", "hub"),
    ("a", "failed", "hub"),
    ("b", "completed", "b_done"),
    ("b", "failed", "hub"),
    ("b_done", "completed", "hub"),
]
"""A hub routing to stages ``a`` and ``b``; ``b`` completed leads on to ``b_done``, not back."""


LOOP = Pipeline(
    "loop",
    initial="work",
    transitions=[
        ("work", "completed", "work"),
        ("work", "failed", "work"),
        ("work", "done", "end"),
    ],
    final=["end"],
)
"""A one-stage loop: ``work`` completed or failed returns to ``work``; ``done`` ends it."""


def hub_table(*, hub: bool) -> Pipeline:
    """The `HUB_ROWS` table, declaring ``hub`` its hub (implicit routes) or not (strict)."""
    return Pipeline(
        "hubbed", initial="hub", transitions=HUB_ROWS, final=["end"], hub="hub" if hub else None
    )


def hub_history(engine: Engine, *, explicit: bool, hub: bool = True) -> Run:
    """Outcomes of a, b (failed), b, then b_done, each routed from the hub, the route recorded
    as an event (`explicit`) or taken implicitly."""
    run = engine.start_run(hub_table(hub=hub))

    def routed(stage: str) -> None:
        if explicit:
            run.record(StageCompleted, stage="hub", attempt=DECIDED, outcome=stage)

    routed("a")
    run.stage_completed("a")
    routed("b")
    run.stage_failed("b", error="boom")
    routed("b")
    run.stage_completed("b")
    run.stage_completed("b_done")  # b completed leads to b_done: no route needed
    return run


def postgres_problem() -> str | None:
    """Why PostgreSQL cannot be used, or None when it answers."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg.Error as error:
        return f"no PostgreSQL reachable at {POSTGRES_URL}: {str(error).strip()}"
    return None


def require_postgres() -> None:
    """Skip the test when PostgreSQL is unreachable, or fail under STAGETRAIL_REQUIRE_POSTGRES=1."""
    problem = postgres_problem()
    if problem is None:
        return
    if os.environ.get("STAGETRAIL_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"STAGETRAIL_REQUIRE_POSTGRES=1 but {problem}")
    pytest.skip(problem)


CHROMIUM = Path("/usr/bin/chromium")
"""Debian's Chromium, which the browser tests drive (Playwright never downloads one)."""


def browser_problem(chromium: Path = CHROMIUM) -> str | None:
    """Why the browser tests cannot run, or None when Chromium and Playwright are there."""
    if not chromium.exists():
        return f"{chromium} is missing: apt-get install chromium (as .ci/run does)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[ui]')"
    return None


def require_browser(chromium: Path = CHROMIUM) -> None:
    """Skip the test when no browser is there, or fail under STAGETRAIL_REQUIRE_BROWSER=1."""
    problem = browser_problem(chromium)
    if problem is None:
        return
    if os.environ.get("STAGETRAIL_REQUIRE_BROWSER") == "1":
        pytest.fail(f"STAGETRAIL_REQUIRE_BROWSER=1 but {problem}")
    pytest.skip(problem)


class FailureCount(Projection[dict[str, int]]):
    """A cross-run count of failures by stage, which knows how to forget a run."""

    name = "failure_count"

    def initial(self) -> dict[str, int]:
        return {}

    @on(StageFailed)
    def failed(self, state: dict[str, int], event: StageFailed) -> dict[str, int]:
        return {**state, event.stage: state.get(event.stage, 0) + 1}

    def forget(self, state: dict[str, int], gone: dict[str, int]) -> dict[str, int]:
        left = {stage: count - gone.get(stage, 0) for stage, count in state.items()}
        return {stage: count for stage, count in left.items() if count}


def compact_killed_after_first_erase(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """`engine.compact()` on PostgreSQL, its process dying before its second erase
    transaction (a `KeyboardInterrupt` where the next `_erase_some` would run)."""
    from engine.store.postgres import open as postgres_open

    first = postgres_open._erase_some
    calls: list[int] = []

    def killed(*args: object) -> object:
        if calls:
            raise KeyboardInterrupt  # the process dies before its next transaction
        calls.append(1)
        return first(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(postgres_open, "_erase_some", killed)
    with pytest.raises(KeyboardInterrupt):
        engine.compact()
    monkeypatch.setattr(postgres_open, "_erase_some", first)


def calls_to(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[tuple[Any, ...]]:
    """The positional arguments of each call to `owner.name` from now on (the test's end),
    which `owner.name` still answers as before."""
    real = getattr(owner, name)
    calls: list[tuple[Any, ...]] = []

    def recorded(*args: Any, **options: Any) -> Any:
        calls.append(args)
        return real(*args, **options)

    monkeypatch.setattr(owner, name, recorded)
    return calls


def erased_after_its_first_page(
    url: str, doomed: UUID, monkeypatch: pytest.MonkeyPatch, after: int | None = None
) -> None:
    """Every stream of `doomed` is followed, once its first page is read (or its event
    `after`: once that is taken), by a compaction of the store by another engine (which
    erases the run) before the next page is read."""
    from engine.store.event_store import PAGE, Store

    after = PAGE if after is None else after

    streamed = Store.stream

    def stream(store: Store, run_id: UUID, **pages: Any) -> Iterator[Event]:
        events = streamed(store, run_id, **pages)
        if run_id != doomed:
            yield from events
            return
        for event in events:
            yield event
            if event.version == after:
                with Engine(url) as other:
                    assert other.compact().runs == (doomed,)

    monkeypatch.setattr(Store, "stream", stream)


class FailuresByType(Projection[dict[str, int]]):
    """Counts failures by error type: the custom projection of the docs."""

    name = "failures_by_type"

    def initial(self) -> dict[str, int]:
        return {}

    @on(StageFailed)
    def failed(self, state: dict[str, int], event: StageFailed) -> dict[str, int]:
        return {**state, event.error_type: state.get(event.error_type, 0) + 1}


class BreaksOnTimeouts(Projection[int]):
    """Counts failures, and raises on a Timeout: a projection that fails part-way."""

    def initial(self) -> int:
        return 0

    @on(StageFailed)
    def failed(self, state: int, event: StageFailed) -> int:
        if event.error_type == "Timeout":
            raise RuntimeError("cannot count timeouts")
        return state + 1


# The table written out by hand, independently of Pipeline's lookup.
EXPECTED = {
    ("project_analysis", "completed"): "code_review",
    ("project_analysis", "aborted"): "aborted",
    ("code_review", "completed"): "developer",
    ("code_review", "aborted"): "aborted",
    ("developer", "completed"): "testing",
    ("developer", "failed"): "developer",
    ("developer", "aborted"): "aborted",
    ("testing", "completed"): "done",
    ("testing", "failed"): "developer",
    ("testing", "aborted"): "aborted",
}


@contextlib.contextmanager
def transcript_clock(start: str) -> Iterator[None]:
    """Frozen time that ticks 0.25 s per reading, and no garbage collection meanwhile.

    Hypothesis installs a garbage-collector callback that reads the clock, so once a
    property test has run, every collection would tick the frozen clock too, and a
    transcript's times would depend on when the collector happened to run.
    """
    gc.collect()
    gc.disable()
    try:
        with freeze_time(start, auto_tick_seconds=0.25):
            yield
    finally:
        gc.enable()


class PausedThread:
    """A thread running `work` that stops once, on reaching the line of `function` holding
    `text`, until `finish`: a race between that line and what the test does meanwhile,
    played in a fixed order."""

    def __init__(self, function: Callable[..., Any], text: str, work: Callable[[], Any]) -> None:
        lines, first = inspect.getsourcelines(function)
        self.line = first + next(at for at, line in enumerate(lines) if text in line)
        self.code = function.__code__
        self.reached, self.resume = threading.Event(), threading.Event()
        self.result: Any = None
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(work,), daemon=True)

    def start(self) -> PausedThread:
        """Start the thread; return once it stopped at the line."""
        self.thread.start()
        assert self.reached.wait(10), "the thread never reached the line"
        return self

    def finish(self) -> Any:
        """Let the thread go on; its work's result once it ended."""
        self.resume.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        if self.failure is not None:
            raise self.failure
        return self.result

    def _run(self, work: Callable[[], Any]) -> None:
        sys.settrace(self._trace)
        try:
            self.result = work()
        except BaseException as failure:  # handed to `finish`
            self.failure = failure
        finally:
            sys.settrace(None)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._trace_line if frame.f_code is self.code else None

    def _trace_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == self.line and not self.reached.is_set():
            self.reached.set()
            self.resume.wait(10)
        return self._trace_line


def switching_often(work: Callable[[int], None], seeds: Iterable[int]) -> None:
    """`work(seed)` in a thread per seed, all at once, the interpreter switching between
    them every microsecond (so that they interleave far more than they would)."""
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(seed,)) for seed in seeds]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switching)
