"""A catch-up killed with SIGKILL at any point resumes exactly once: no event twice, none lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from engine import Engine
from projections import BUILT_INS
from tests._helpers import REVIEW

CATCHER = textwrap.dedent(
    """
    import sys
    import engine.readside.persistent
    from engine import Engine
    from projections import BUILT_INS
    from tests._helpers import FailuresByType

    engine.readside.persistent.PAGE = 37  # many small transactions, many places to die
    engine = Engine(sys.argv[1])
    for projection in (*BUILT_INS, FailuresByType):
        engine.projections.register(projection)
    report = lambda name, position, head: print(name, position, flush=True)
    engine.projections.catch_up(on_progress=report)
    print("done", flush=True)
    """
)


def fill(url: str) -> None:
    """Twenty runs with failures, rollbacks, tasks and budget: about 1,000 events."""
    with Engine(url) as engine:
        for number in range(20):
            run = engine.start_run(REVIEW, labels={"n": str(number % 3)})
            with run.batch():
                run.stage_completed("project_analysis", result={})
                run.stage_completed("code_review", result={"n": number})
                for attempt in range(12):
                    run.add_task(f"t{attempt}")
                    run.task_started(f"t{attempt}")
                    run.stage_failed("developer", error=f"e{attempt % 4}", error_type="Build")
                    run.task_completed(f"t{attempt}", result=attempt)
                    run.spend(0.5, "usd")
                    if attempt % 5 == 4:
                        run.rollback(steps=2)
            if number % 2:
                run.finish("failed")


def kill_catch_up_after(url: str, pages: int) -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen(
        [sys.executable, "-c", CATCHER, url], stdout=subprocess.PIPE, text=True, cwd=root
    )
    assert child.stdout is not None
    for _ in range(pages):
        assert child.stdout.readline().strip() != "done"
    child.send_signal(signal.SIGKILL)
    child.wait()


@pytest.mark.slow
class TestKilledCatchUp:
    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    @pytest.mark.parametrize("pages", [1, 9, 30])
    def test_resumed_catch_up_equals_a_clean_rebuild(
        self, backend: str, pages: int, request: pytest.FixtureRequest
    ) -> None:
        """After SIGKILL mid-catch-up, resuming gives exactly what a rebuild from zero gives."""
        from tests._helpers import FailuresByType

        url = request.getfixturevalue(backend)
        fill(url)
        kill_catch_up_after(url, pages)
        with Engine(url) as engine:
            for projection in (*BUILT_INS, FailuresByType):
                engine.projections.register(projection)
            interrupted = {s.name: s.position for s in engine.projections.status()}
            assert min(interrupted.values()) < engine.projections.head()
            engine.projections.catch_up()
            resumed = {name: engine.projections.states(name) for name in engine.projections.names}
            for name in engine.projections.names:
                engine.projections.rebuild(name)
            rebuilt = {name: engine.projections.states(name) for name in engine.projections.names}
        assert resumed == rebuilt
        assert resumed["failures_by_type"][""] == {"Build": 240}
