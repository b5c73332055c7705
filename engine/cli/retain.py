"""`stagetrail retain`: delete finished runs by rules (dry run unless --apply), then compact."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.cli.common import Output, print_json, short, when

if TYPE_CHECKING:
    from engine.engine import Engine, Retention
    from engine.retention import RetentionRule

SHOWN = 20
"""How many chosen runs the text output lists (the count is always whole)."""


def retain_runs(engine: Engine, rules: list[RetentionRule], *, apply: bool, as_json: bool) -> None:
    """Print the runs the rules choose; with `apply`, delete and compact them."""
    done = engine.retain(rules, apply=apply)
    if as_json:
        print_json(_as_json(done))
        return
    out = Output()
    verb = "deleted" if done.applied else "would delete"
    out.line(f"{verb} {len(done.runs)} run(s)" + ("" if done.applied else " (dry run; --apply)"))
    for doomed in done.runs[:SHOWN]:
        summary = doomed.summary
        finished = when(summary.finished) if summary.finished else "-"
        out.line(
            f"  {short(summary.run_id)}  {summary.pipeline}  {summary.status}  "
            f"finished {finished}  rule {doomed.rule}"
        )
    if len(done.runs) > SHOWN:
        out.line(f"  … and {len(done.runs) - SHOWN} more (--json lists the first 1000)")
    if done.compacted is not None:
        out.line(f"compacted: {done.compacted.events} events removed")


def _as_json(done: Retention) -> dict[str, object]:
    return {
        "applied": done.applied,
        "count": len(done.runs),
        "runs": [
            {"run_id": str(d.run_id), "status": d.summary.status, "rule": d.rule.to_json()}
            for d in done.runs[:1000]
        ],
        "events_removed": None if done.compacted is None else done.compacted.events,
    }
