"""Runs as OpenTelemetry traces (the ``otel`` extra): on demand and live.

A run is a trace (a child run a child span of its parent's run span), each
stage attempt and task a span, retries, breaker changes, rollbacks and the
verdict span events of the run's span, its labels attributes. `export_runs`
sends runs through any span exporter of the SDK; `OtelTraces`, registered as a
persistent projection, exports each run's spans as its events are recorded.
See docs/otel.md.
"""

from __future__ import annotations

from engine.integrations.otel.export import (
    Exported,
    OtelExportFailed,
    OtelTraces,
    RunRoots,
    export_runs,
    exported_fields,
    memory_exporter,
    otlp_exporter,
    run_spans,
    traces_url,
)
from engine.integrations.otel.sdk import span_id, to_spans, trace_id
from engine.integrations.otel.trace import SpanRecord, flush, step

__all__ = [
    "Exported",
    "OtelExportFailed",
    "OtelTraces",
    "RunRoots",
    "SpanRecord",
    "export_runs",
    "exported_fields",
    "flush",
    "memory_exporter",
    "otlp_exporter",
    "run_spans",
    "span_id",
    "step",
    "to_spans",
    "trace_id",
    "traces_url",
]
