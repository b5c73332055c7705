"""Engine.compact: deleted runs leave the store physically; projections forget them."""

from __future__ import annotations

import pytest

from engine import Engine, RunNotFound
from engine.cli.demo.code_review import REVIEW


def failed_run(engine: Engine, card: str, status: str) -> str:
    """A run with one failed attempt of the developer stage, finished with `status`."""
    run = engine.start_run(REVIEW, params={"card": card})
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    run.stage_failed("developer", error=RuntimeError(f"broke on {card}"))
    run.finish(status)
    return str(run.id)


class TestCompact:
    def test_deleted_runs_are_erased_and_the_others_stay(self, engine: Engine) -> None:
        """Only runs finished as deleted lose their events; the report names them."""
        kept = failed_run(engine, "C-1", "failed")
        doomed = failed_run(engine, "C-2", "deleted")
        assert len(engine.events(doomed)) == 5
        done = engine.compact()
        assert [str(r) for r in done.runs] == [doomed]
        assert done.events == 5
        assert done.rebuilt == (
            "failure_patterns",
        )  # run_index forgot it as it folded the deletion
        with pytest.raises(RunNotFound):
            engine.events(doomed)
        assert len(engine.events(kept)) == 5
        assert [str(s.run_id) for s in engine.runs()] == [kept]

    def test_cross_run_projections_forget_the_erased_runs(self, engine: Engine) -> None:
        """FailurePatterns across runs no longer counts a compacted run's failures."""
        failed_run(engine, "C-1", "failed")
        failed_run(engine, "C-2", "deleted")
        before = engine.projections.get("failure_patterns", REVIEW.name)
        assert before.by_stage == {"developer": 2}
        engine.compact()
        after = engine.projections.get("failure_patterns", REVIEW.name)
        assert after.by_stage == {"developer": 1}

    def test_runs_recorded_after_compaction_are_indexed(self, engine: Engine) -> None:
        """Events appended after the newest events were erased still reach the projections."""
        failed_run(engine, "C-1", "failed")
        failed_run(engine, "C-2", "deleted")
        engine.compact()
        later = failed_run(engine, "C-3", "failed")
        assert str(engine.runs()[0].run_id) == later
        assert engine.projections.get("failure_patterns", REVIEW.name).by_stage == {"developer": 2}

    def test_nothing_to_compact(self, engine: Engine) -> None:
        """A store without deleted runs is left as it is."""
        kept = failed_run(engine, "C-1", "succeeded")
        done = engine.compact()
        assert (done.runs, done.events, done.rebuilt) == ((), 0, ())
        assert len(engine.events(kept)) == 5
