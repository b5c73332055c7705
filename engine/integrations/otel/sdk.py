"""Span records as the OpenTelemetry SDK's spans, with ids that depend on the run alone.

A trace's id is its root run's id (a child run's trace is its top ancestor's);
a span's id is the first 8 bytes of SHA-256 over its run and key. Exporting the
same run twice gives the same ids, so a receiver that keeps one span per id
(every trace store does) holds each once: what a follower that died between
exporting and recording its progress exports again is the same spans.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from uuid import UUID

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from engine.integrations.otel.trace import SpanRecord

Roots = Callable[[str], str]
"""The root run (top ancestor) of a run, by id: whose trace the run's spans belong to."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SCOPE = InstrumentationScope("stagetrail")


def span_id(run_id: str, key: str) -> int:
    """The span id of the span `key` of run `run_id` (never 0, which means none)."""
    digest = hashlib.sha256(f"{run_id}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def trace_id(root_run_id: str) -> int:
    """The trace id of a root run's trace: its UUID's 128 bits."""
    return UUID(root_run_id).int


def nanoseconds(moment: datetime) -> int:
    """`moment` as nanoseconds since the Unix epoch (exactly: to the microsecond)."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def to_spans(
    records: Sequence[SpanRecord], roots: Roots, service: str = "stagetrail"
) -> list[ReadableSpan]:
    """`records` as the SDK's finished spans, ready for any span exporter."""
    resource = Resource.create({"service.name": service})
    return [_span(record, roots, resource) for record in records]


def _context(run_id: str, key: str, roots: Roots) -> SpanContext:
    return SpanContext(
        trace_id(roots(run_id)), span_id(run_id, key), is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )  # fmt: skip


def _span(record: SpanRecord, roots: Roots, resource: Resource) -> ReadableSpan:
    parent = record.parent_key
    status = Status(StatusCode.UNSET)
    if record.error is not None:
        status = Status(StatusCode.ERROR, record.error)
    events = [
        SpanEvent(name, dict(attributes), nanoseconds(moment))
        for name, moment, attributes in record.events
    ]
    if record.error is not None and record.key != "run":
        exception = {"exception.message": record.error}
        if "error.type" in record.attributes:
            exception["exception.type"] = str(record.attributes["error.type"])
        events.append(SpanEvent("exception", exception, nanoseconds(record.end)))
    links = []
    if record.forked_from is not None:
        origin = record.forked_from[0]
        links.append(
            Link(_context(origin, "run", roots), {"stagetrail.forked_at": record.forked_from[1]})
        )
    return ReadableSpan(
        name=record.name,
        context=_context(record.run_id, record.key, roots),
        parent=None if parent is None else _context(*parent, roots),
        resource=resource,
        attributes=dict(record.attributes),
        events=events,
        links=links,
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=nanoseconds(record.start),
        end_time=nanoseconds(record.end),
        instrumentation_scope=SCOPE,
    )
