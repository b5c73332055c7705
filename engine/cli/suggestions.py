"""The three commands `stagetrail demo` suggests, derived from the runs it recorded."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING
from uuid import UUID

from events import StageFailed

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.run import Run


def unique_prefix(engine: Engine, run_id: UUID, shortest: int = 8) -> str:
    """The shortest prefix of `run_id` (at least `shortest` characters) naming only that run."""
    text = str(run_id)
    for length in range(shortest, len(text)):
        if text[length - 1] == "-":
            continue
        if len(engine.projections.run_ids(text[:length], limit=2)) == 1:
            return text[:length]
    return text


def _first_failure(engine: Engine, run: Run) -> int | None:
    for event in engine.store.stream(run.id):
        if isinstance(event, StageFailed):
            return event.version
    return None


def program() -> str:
    """How to run stagetrail again, as the user ran it: ``stagetrail`` when that name on PATH
    is this program, else the path it was started by (a virtual environment not on PATH).

    In process (tests, the docs' transcripts) it is ``stagetrail``.
    """
    started = sys.argv[0] if sys.argv else ""
    if os.path.basename(started) not in ("stagetrail", "stagetrail.exe"):
        return "stagetrail"
    found = shutil.which("stagetrail")
    try:
        if found is not None and os.path.samefile(found, started):
            return "stagetrail"
    except OSError:  # the started path is gone or unreadable: say it as it was given
        pass
    return shlex.quote(started)


def next_commands(engine: Engine, runs: Sequence[Run], store: str | None) -> list[str]:
    """Three commands worth trying on `runs`: list the troubled ones, show one, travel back."""
    if not runs:
        return []
    suffix = "" if store is None else f" --store {shlex.quote(engine.url)}"
    failures = {run.id: _first_failure(engine, run) for run in runs}
    troubled = next((run for run in runs if failures[run.id] is not None), runs[0])
    prefix = unique_prefix(engine, troubled.id)
    unhappy = next((run.status for run in runs if run.status not in (None, "succeeded")), None)
    name = program()
    listing = f"{name} runs" + (f" --status {unhappy}" if unhappy else "")
    at = failures[troubled.id] or min(2, troubled.version)
    return [
        listing + suffix,
        f"{name} show {prefix}{suffix}",
        f"{name} state {prefix} --at {at}{suffix}",
    ]
