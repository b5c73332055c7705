from __future__ import annotations

import contextlib
import importlib.util
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from engine import Engine
from engine.ui import snapshot
from engine.ui.snapshot import PANELS, RunView
from events import StageCompleted, StageStarted
from projections import ProjectionError
from projections.base import Folding, folding
from tests.readside.test_snapshots import applied_one_by_one, broken, random_histories
from tests.ui._helpers import record_long, stock


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

    def test_each_part_after_each_event_is_its_own_projections_state(self, sqlite_url: str) -> None:
        """Folded side by side (each event only to the parts it may change), every part's state
        after every event of every kind of run equals its own projection's fold."""
        stocked = stock(sqlite_url)
        view, parts = RunView(), [cls() for cls in PANELS.values()]
        with Engine(sqlite_url, create=False) as engine:
            runs = [run.run_id for run in engine.runs(limit=100)]
            assert len(runs) >= len(stocked.supervised) + 3
            for run_id in runs:
                state, alone = view.initial(), [part.initial() for part in parts]
                for event in engine.events(run_id):
                    state = view.apply(state, event)
                    alone = [
                        part.apply(each, event) for part, each in zip(parts, alone, strict=True)
                    ]
                    assert state == tuple(alone), (run_id, event.version)

    def test_which_parts_an_event_reaches_is_part_of_the_fingerprint(self, tmp_path: Path) -> None:
        """RunView's code deciding which parts each event class reaches counts in its
        fingerprint: changed, the views stored before are stale (not served)."""
        source = Path(snapshot.__file__).read_text()
        reaching = "elif (handler := part.handlers.get(kind)) is not None:"
        assert reaching in source
        changed = tmp_path / "changed_snapshot.py"
        changed.write_text(source.replace(reaching, "elif (handler := None) is not None:"))
        spec = importlib.util.spec_from_file_location("changed_snapshot", changed)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.RunView.fingerprint() != RunView.fingerprint()

    def test_the_shipped_fingerprint_is_kept(self) -> None:
        """RunView's fingerprint (which covers its parts', the stack's among them) is the
        shipped one: a change makes every stored view stale, so it is made on purpose only."""
        assert RunView.fingerprint() == "aecdc03cbb6babd8"  # as of 909f60c


class TestRunViewFolding:
    @pytest.mark.parametrize("seed", [1, 2])
    def test_fed_in_parts_it_holds_after_each_part_what_apply_makes(self, seed: int) -> None:
        """Fed parts of any length (one event to all at once), each part folding them its own
        way, the view after each part is the one `apply` makes event by event."""
        pick = random.Random(seed)
        for events in random_histories(seed):
            expected = applied_one_by_one(RunView(), events)
            fed = folding(RunView())
            assert isinstance(fed, snapshot._Panels)
            done = 0
            while done < len(events):
                size = pick.choice([1, 2, 7, 30, 80])
                fed.feed(events[done : done + size])
                done = min(done + size, len(events))
                assert fed.state() == expected[events[done - 1].version]

    def test_a_subclass_with_an_apply_of_its_own_is_fed_through_it(self) -> None:
        """A view whose `apply` is its own is folded by it (a plain `Folding`), never by parts."""

        class OwnView(RunView):
            def apply(self, state: Any, event: Any) -> Any:
                return super().apply(state, event)

        assert type(folding(OwnView())) is Folding
        assert type(folding(RunView(), RunView().initial())) is snapshot._Panels

    def test_an_error_names_the_first_event_any_part_fails_on(self) -> None:
        """A later event breaking the first part and an earlier one a later part: the error is
        `apply`'s, on the earlier event, naming its part."""
        events = random_histories(5)[0]
        early = next(e for e in events if type(e) is StageStarted and e.version > 3)
        late = next(e for e in events if type(e) is StageCompleted and e.version > early.version)
        tampered = {
            early.version: broken(early, stage=[1]),
            late.version: broken(late, outcome=[1]),
        }
        stream = [tampered.get(event.version, event) for event in events]
        with pytest.raises(ProjectionError) as expected:
            applied_one_by_one(RunView(), stream)
        with pytest.raises(ProjectionError) as caught:
            folding(RunView()).feed(stream)
        assert str(caught.value) == str(expected.value)
        assert (caught.value.projection, caught.value.version) == ("retry_counts", early.version)
