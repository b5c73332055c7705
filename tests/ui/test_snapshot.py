from __future__ import annotations

import contextlib
import json
import sqlite3

from engine import Engine
from engine.ui.snapshot import RunView
from tests.ui._helpers import record_long


class TestRunView:
    def test_snapshots_are_small_and_restore_the_same_states(self, sqlite_url: str) -> None:
        """RunView stores its parts' small snapshots, and a fresh engine restores equal states."""
        run_id = record_long(sqlite_url, 1_600)  # 3,203 events, a stack 1,600 frames deep
        with Engine(sqlite_url) as engine:
            engine.project(run_id, RunView, at=3_203)
            whole = len(json.dumps(RunView().encode(engine.project(run_id, RunView))))
        path = sqlite_url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as db:
            sizes = db.execute(
                "SELECT version, length(state) FROM stagetrail_snapshots WHERE projection = ?",
                (RunView.name,),
            ).fetchall()
        assert [version for version, _ in sizes] == [500 * n for n in range(1, 7)]
        assert max(size for _, size in sizes) < whole / 10
        with Engine(sqlite_url) as fresh:
            for at in (1_000, 2_750, 3_203):
                expected = RunView().fold(fresh.events(run_id, upto=at))
                assert fresh.project(run_id, RunView, at=at) == expected
