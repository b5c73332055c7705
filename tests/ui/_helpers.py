"""Stores for the viewer's tests: the examples, a hostile run, and what the stack should show."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import attrs
import pytest

from engine import Engine, Pipeline
from engine.cli.demo import supervised_review
from engine.cli.demo.code_review import REVIEW
from projections import StateStack
from tests.cli._helpers import Filled, fill

HOSTILE_STAGE = '<img src=x onerror="window.__pwned=1">'
HOSTILE_RESULT = {"html": "<script>window.__pwned=2</script>", "note": "</pre><b>bold?</b>"}
HOSTILE_ERROR = "<img src=x onerror=window.__pwned=3>"

HOSTILE = Pipeline(
    "evil<script>window.__pwned=4</script>",
    initial=HOSTILE_STAGE,
    transitions=[
        (HOSTILE_STAGE, "failed", HOSTILE_STAGE),
        (HOSTILE_STAGE, "completed", "done"),
    ],
    final=["done"],
)
"""A pipeline whose names, results and errors are markup that would run if not escaped."""


@attrs.frozen
class Stocked:
    """A store with the examples, two supervised runs and a hostile run."""

    url: str
    filled: Filled
    supervised: tuple[UUID, ...]
    hostile: UUID


def record_hostile(engine: Engine) -> UUID:
    """A run of `HOSTILE` with markup in its labels, error and result."""
    run = engine.start_run(HOSTILE, labels={"who": "<script>window.__pwned=5</script>"})
    run.stage_started(HOSTILE_STAGE)
    run.stage_failed(HOSTILE_STAGE, HOSTILE_ERROR, error_type="Injected", duration=1.0)
    run.stage_completed(HOSTILE_STAGE, HOSTILE_RESULT, duration=2.0)
    run.finish("succeeded", reason="<img src=x onerror=window.__pwned=6>")
    return run.id


def stock(url: str) -> Stocked:
    """Fill the store at `url` with every kind of run the viewer must show."""
    filled = fill(url)
    with Engine(url) as engine:
        supervised = tuple(run.id for run in supervised_review.record_all(engine))
        hostile = record_hostile(engine)
    return Stocked(url, filled, supervised, hostile)


def stack_rows(engine: Engine, run_id: UUID, at: int) -> list[list[str]]:
    """The rows the stack table must show after event `at`: each frame of `engine.project`."""
    stack = engine.project(run_id, StateStack, at=at)
    return [
        [
            str(position),
            str(frame.version),
            frame.state,
            frame.stage,
            frame.outcome,
            str(frame.attempt),
            f"{frame.duration:.1f}s",
            f"{frame.error_type}: {frame.error}" if frame.failed else _compact(frame.result),
        ]
        for position, frame in enumerate(stack.frames, start=1)
    ]


def _compact(value: Any) -> str:
    """A value as JavaScript's JSON.stringify writes it (the page's result cells)."""
    return "" if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def record_long(url: str, failures: int) -> UUID:
    """A review whose build fails `failures` times: two events per failure."""
    with Engine(url) as engine:
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", {"project_type": "python"})
        run.stage_completed("code_review", {"critical": 1})
        for attempt in range(failures):
            run.stage_started("developer")
            run.stage_failed("developer", f"compile error #{attempt}", error_type="BuildException")
        return run.id


HIGHLIGHTED = (
    "nodes => nodes.map(node =>"
    " JSON.parse(document.getElementById('run-data').textContent).states[node.dataset.node])"
)
"""Playwright: the names of the diagram's nodes matched (``data-node`` indexes the states)."""

COUNT_ADDRESS_WRITES = """() => {
  window.addressWrites = [];
  const write = history.replaceState.bind(history);
  history.replaceState = function (state, unused, address) {
    window.addressWrites.push(address);
    write(state, unused, address);
  };
}"""
"""Playwright: record every address the page writes from now on."""

SHOWN_ROWS = "rows => rows.map(row => Array.from(row.cells, cell => cell.textContent))"
"""Playwright: the text of every cell of every row matched."""


UNCOVERED_BAR = "#gantt rect.bar >> nth=-1"
"""Playwright: the timeline's last bar, drawn over any it meets. A short attempt's bar is grown
to the left of its end, over the end of the bar before it in its row: the pointer at the middle
of a bar drawn earlier can be over the next one instead (and make that one's tooltip)."""


def pointer_off_the_timeline(page: Any) -> None:
    """Rest the pointer at the page's top left corner, off the timeline. A window drawn under a
    resting pointer gets a pointerover from the browser, as for a user: the bar or marker now
    under it makes its tooltip, without the pointer moving."""
    page.mouse.move(0, 0)


def move_slider(page: Any, version: int) -> None:
    """Set the slider to `version` and wait until the page has drawn that version."""
    page.fill("#slider", str(version))
    page.wait_for_selector(f"body[data-shown-version='{version}']", state="attached")


def stocked_fixtures(name: str) -> tuple[Any, Any, Any]:
    """A module's `stocked` store, the `viewer` serving it and an `engine` on it (module
    fixtures, for `stocked, viewer, engine = stocked_fixtures(...)`): named fixtures in
    tests/ui/conftest.py would hide the suite's own `engine` from the other modules."""

    @pytest.fixture(scope="module")
    def stocked(tmp_path_factory: pytest.TempPathFactory) -> Stocked:
        """A SQLite store with the examples, supervised runs and a hostile run."""
        return stock(f"sqlite:///{tmp_path_factory.mktemp(name) / 'runs.db'}")

    @pytest.fixture(scope="module")
    def viewer(serve: Any, stocked: Stocked) -> Any:
        """`stagetrail ui` serving the stocked store."""
        return serve(stocked.url)

    @pytest.fixture(scope="module")
    def engine(stocked: Stocked) -> Iterator[Engine]:
        """The stocked store, for the expected answers."""
        with Engine(stocked.url, create=False) as opened:
            yield opened

    return stocked, viewer, engine
