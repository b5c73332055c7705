"""Writes `text_ids_store.db`: a SQLite store as stagetrail wrote it before compact storage.

Its events table keys runs by 36-character text UUIDs and names each event by its
full topic, as every store did up to issue 26; its views hold a run index, the
cross-run failure patterns and stored time-travel snapshots. The file was
written once by that code (commit 0514c62) and is checked in: a later release
must still open, read, verify and append to it. Do not regenerate it with newer
code; this script documents how it was made::

    python tests/data/make_text_ids_store.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from uuid import UUID

TARGET = Path(__file__).with_name("text_ids_store.db")

LONG_RUN = UUID("00000000-0000-4000-8000-0000000000a1")
"""A loop of 600 events (1 outcome in 7 failed): long enough for stored snapshots."""
SHORT_RUN = UUID("00000000-0000-4000-8000-0000000000a2")
"""A short run with a rollback, a note, tasks and budget, finished succeeded."""
OPEN_RUN = UUID("00000000-0000-4000-8000-0000000000a3")
"""A run still in progress, to be appended to."""
LONG_EVENTS = 600


def main() -> None:
    """Write the store next to this script (refusing to overwrite it)."""
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    from engine import Engine, Pipeline
    from projections import RetryCounts, StateStack

    if TARGET.exists():
        raise SystemExit(f"{TARGET} exists: it is checked in, never regenerated")
    loop = Pipeline(
        "loop",
        initial="work",
        transitions=[
            ("work", "completed", "work"),
            ("work", "failed", "work"),
            ("work", "done", "end"),
        ],
        final=["end"],
    )
    with Engine(f"sqlite:///{TARGET}") as engine:
        run = engine.start_run(loop, run_id=LONG_RUN, labels={"team": "core"})
        with run.batch():
            for index in range(LONG_EVENTS - 1):
                if index % 7 == 6:
                    run.stage_failed("work", "boom", error_type="BuildError", duration=2.5)
                else:
                    run.stage_completed("work", {"n": index}, duration=1.0)
        engine.project(LONG_RUN, StateStack, at=LONG_EVENTS - 5)  # stores snapshots
        engine.project(LONG_RUN, RetryCounts, at=LONG_EVENTS - 5)
        short = engine.start_run(loop, run_id=SHORT_RUN, params={"card": "C-1"})
        short.stage_completed("work", {"step": 1}, duration=1.0)
        short.stage_failed("work", "flaky", error_type="TimeoutError", duration=3.0)
        short.rollback(1, reason="undo the failure")
        short.note("strategy", "smaller diffs")
        short.add_task("t-1", title="first task")
        short.task_started("t-1")
        short.task_completed("t-1", result={"ok": True})
        short.spend(0.25, "usd")
        short.stage_completed("work", {"step": 2}, outcome="done", duration=1.0)
        short.finish("succeeded")
        still = engine.start_run(loop, run_id=OPEN_RUN)
        still.stage_completed("work", {"step": 1}, duration=1.0)
        engine.runs()  # the run index caught up and stored
        engine.projections.catch_up()


if __name__ == "__main__":
    main()
