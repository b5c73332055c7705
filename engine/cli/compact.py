"""`stagetrail compact`: physically remove deleted runs and rebuild the projections."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.cli.common import Output, listed, print_json, short

if TYPE_CHECKING:
    from engine.engine import Engine

LISTED = 20
"""Removed runs the text names (--json lists the first `common.LISTED_JSON`)."""


def compact_store(engine: Engine, *, as_json: bool) -> None:
    """Compact the store; print what was removed and which projections were rebuilt."""
    done = engine.compact()
    if as_json:
        print_json(
            {**listed("runs", done.runs), "events": done.events, "rebuilt": list(done.rebuilt)}
        )
        return
    out = Output()
    if not done.runs:
        out.line("nothing to compact: no run is deleted")
        return
    ids = ", ".join(short(run_id) for run_id in done.runs[:LISTED])
    ids += f" and {len(done.runs) - LISTED} more" if len(done.runs) > LISTED else ""
    out.line(f"removed {len(done.runs)} deleted run(s) ({done.events} events): {ids}")
    out.line(f"rebuilt projections: {', '.join(done.rebuilt) or 'none'}")
