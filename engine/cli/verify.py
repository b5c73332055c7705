"""`stagetrail verify`: re-fold a run through its stored table and the projections."""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from engine.cli.common import Output, print_json, short

if TYPE_CHECKING:
    from engine.engine import Engine


def verify_run(engine: Engine, run_id: UUID, *, as_json: bool) -> bool:
    """Verify the run; print the report; return whether it is sound."""
    report = engine.verify(run_id)
    if as_json:
        print_json(
            {
                "run_id": str(run_id),
                "ok": report.ok,
                "events": report.events,
                "problems": [
                    {"version": p.version, "check": p.check, "message": p.message}
                    for p in report.problems
                ],
            }
        )
        return report.ok
    out = Output()
    if report.ok:
        out.line(f"run {short(run_id)}: {report.events} events, no problems", "green")
        return True
    out.line(
        f"run {short(run_id)}: {report.events} events, {len(report.problems)} problem(s)", "red"
    )
    rows = [[str(p.version), p.check, p.message] for p in report.problems]
    out.table(["v", "check", "problem"], rows, right=(0,))
    return False
