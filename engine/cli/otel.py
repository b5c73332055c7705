"""`stagetrail otel`: runs as OpenTelemetry traces, sent over OTLP/HTTP, printed, or followed."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING
from uuid import UUID

from engine.cli.common import BadOption, Output, json_line, parse_time, whole, write_lines

if TYPE_CHECKING:
    from engine.engine import Engine

_EVERY_RUN = 1_000_000_000


EXTRA_HINT = "OpenTelemetry export needs the otel extra: pip install 'stagetrail[otel]'"


def check_extra() -> None:
    """Raise a clear error when the ``otel`` extra is not installed.

    Raises:
        BadOption: naming the missing module and the extra to install.
    """
    try:
        import engine.integrations.otel  # noqa: F401
    except ImportError as error:
        raise BadOption("otel", error.name or "", EXTRA_HINT) from None


def chosen_runs(engine: Engine, run_ids: Sequence[UUID], since: str | None) -> list[UUID]:
    """The runs named, or with none named every run (started at or after `since`), oldest
    first, but those a compaction erases (or has begun to)."""
    if run_ids:
        return list(run_ids)
    moment = None if since is None else parse_time("--since", since)
    summaries = engine.runs(since=moment, limit=_EVERY_RUN)
    return [
        s.run_id for s in reversed(summaries) if s.parent_run_id is None and whole(engine, s.run_id)
    ]


def export(
    engine: Engine,
    run_ids: Sequence[UUID],
    *,
    endpoint: str | None,
    service: str,
    as_json: bool,
    every: bool = False,
) -> None:
    """Export the runs and their child runs: as JSON Lines on stdout, or to the endpoint;
    `every`: the runs are every run listed (`chosen_runs`), so one erased, or being erased,
    since it was listed is passed over."""
    from engine.integrations.otel import (
        export_runs,
        exported_fields,
        memory_exporter,
        otlp_exporter,
    )

    if as_json:
        memory = memory_exporter()
        export_runs(engine, run_ids, memory, service=service, passing_gone=every)
        spans = memory.get_finished_spans()
        write_lines(json_line(exported_fields(span)) for span in spans)
        return
    exporter = otlp_exporter(endpoint)
    try:
        done = export_runs(engine, run_ids, exporter, service=service, passing_gone=every)
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]
    where = "the endpoint of $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" if endpoint is None else endpoint
    Output().line(f"exported {done.spans} span(s) of {done.runs} run(s) to {where}")


def follow(engine: Engine, *, endpoint: str | None, service: str, stop: threading.Event) -> None:
    """Export every run's spans as its events are recorded, until `stop` (Ctrl-C)."""
    from engine.integrations.otel import OtelTraces, otlp_exporter

    exporter = otlp_exporter(endpoint)
    engine.projections.register(OtelTraces(engine, exporter, service))
    Output().line("following the store; Ctrl-C stops")
    try:
        engine.projections.follow(stop)
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]
