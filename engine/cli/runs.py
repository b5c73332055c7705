"""`stagetrail runs`: the run index as a table or JSON, newest first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.arguments import MAX_INT
from engine.cli.common import (
    STATUS_STYLES,
    BadOption,
    Output,
    parse_time,
    print_json,
    seconds,
    short,
    when,
)

if TYPE_CHECKING:
    from engine.engine import Engine
    from projections import RunSummary

COLUMNS = ("run", "pipeline", "status", "state", "started", "duration", "attempts", "failures")


def check_limit(limit: int) -> int:
    """`limit` if a store's query takes it: at most the largest signed 64-bit integer.

    Raises:
        BadOption: naming the number as given and the bound.
    """
    if limit > MAX_INT:
        raise BadOption("--limit", limit, f"must be at most {MAX_INT} (the largest 64-bit integer)")
    return limit


def list_runs(
    engine: Engine,
    *,
    status: str | None,
    pipeline: str | None,
    labels: Sequence[str],
    since: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Print the runs that match, newest first."""
    summaries = engine.runs(
        status=status,
        pipeline=pipeline,
        label=list(labels) or None,
        since=None if since is None else parse_time("--since", since),
        limit=limit,
    )
    if as_json:
        print_json([summary.to_json() for summary in summaries])
        return
    out = Output()
    if not summaries:
        out.line("No runs match.")
        return
    out.table(
        COLUMNS,
        [_row(summary) for summary in summaries],
        styles=[STATUS_STYLES.get(summary.status) for summary in summaries],
        right=(5, 6, 7),
        wrap=(1, 3, 4),
    )


def _row(summary: RunSummary) -> list[str]:
    return [
        short(summary.run_id),
        summary.pipeline,
        summary.status,
        summary.state,
        when(summary.started),
        seconds(summary.duration),
        str(summary.attempts),
        str(summary.failures),
    ]
