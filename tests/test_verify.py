from __future__ import annotations

import uuid

import pytest

from engine import Engine, RunNotFound
from events import RunStarted, StageCompleted, StageFailed, StateRolledBack
from tests._helpers import REVIEW, BreaksOnTimeouts


def started(engine: Engine) -> uuid.UUID:
    run = engine.start_run(REVIEW)
    run.stage_completed("project_analysis", result={})
    return run.id


class TestVerify:
    def test_a_recorded_run_is_ok(self, engine: Engine) -> None:
        """A run recorded through the engine verifies with no problems."""
        run_id = started(engine)
        report = engine.verify(run_id)
        assert report.ok
        assert (report.problems, report.events) == ((), 2)

    def test_an_illegal_transition_is_reported_with_its_version(self, engine: Engine) -> None:
        """An outcome that is no row of the stored table is a problem at its version."""
        run_id = started(engine)
        engine.store.append(
            [
                StageCompleted(
                    run_id=run_id, version=3, stage="code_review", attempt=1, outcome="ship"
                )
            ]
        )
        report = engine.verify(run_id)
        assert not report.ok
        (problem,) = report.problems
        assert (problem.version, problem.check) == (3, "transition")
        assert "'ship'" in problem.message
        assert "completed" in problem.message

    def test_checking_goes_on_after_a_problem(self, engine: Engine) -> None:
        """Every bad event is reported, not only the first."""
        run_id = started(engine)
        engine.store.append(
            [
                StateRolledBack(run_id=run_id, version=3, steps=5),
                StageFailed(run_id=run_id, version=4, stage="testing", attempt=1),
                StageCompleted(run_id=run_id, version=5, stage="code_review", attempt=1),
            ]
        )
        report = engine.verify(run_id)
        assert [p.version for p in report.problems] == [3, 4]

    def test_a_failing_registered_projection_is_reported(self, engine: Engine) -> None:
        """A registered projection that raises is a problem naming it and the version."""
        engine.projections.register(BreaksOnTimeouts)
        run_id = started(engine)
        run = engine.load(run_id)
        run.stage_completed("code_review", result={})
        run.stage_failed("developer", error="slow", error_type="Timeout")
        (problem,) = engine.verify(run_id).problems
        assert problem.version == 4
        assert problem.check == "projection breaks_on_timeouts"

    def test_a_broken_stored_table_is_reported(self, engine: Engine) -> None:
        """A RunStarted whose table no longer builds a pipeline is a problem at version 1."""
        run_id = uuid.uuid4()
        table = {**REVIEW.to_dict(), "initial": "nowhere"}
        engine.store.append([RunStarted(run_id=run_id, version=1, pipeline="p", table=table)])
        (problem,) = engine.verify(run_id).problems
        assert (problem.version, problem.check) == (1, "table")

    def test_unknown_run(self, engine: Engine) -> None:
        """Verifying a run that is not in the store raises RunNotFound."""
        with pytest.raises(RunNotFound):
            engine.verify(uuid.uuid4())


class TestVerifyTime:
    def test_an_event_stamped_before_its_predecessor_is_reported(self, engine: Engine) -> None:
        """Timestamps going backwards (an edited or imported run) are a 'time' problem."""
        from datetime import timedelta

        from events import NoteAdded

        run_id = started(engine)
        earlier = engine.events(run_id)[0].timestamp - timedelta(hours=1)
        engine.store.append(
            [NoteAdded(run_id=run_id, version=3, key="k", value=1, timestamp=earlier)]
        )
        (problem,) = engine.verify(run_id).problems
        assert (problem.version, problem.check) == (3, "time")
