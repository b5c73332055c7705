"""Runs exported as OpenTelemetry traces: on demand, and live by a persistent projection.

`export_runs` folds each run (and, by default, its child runs) and hands the spans
to any span exporter of the SDK (OTLP over HTTP or gRPC, the console, the
in-memory one of tests). `OtelTraces` is a persistent projection like any other:
registered with an engine, its runner folds each new event exactly once, and
before it records how far it got it exports the spans those events ended, so a
follower that dies between the two exports them again, with the same ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from uuid import UUID

import attrs
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine.errors import RunBeingErased, RunNotFound
from engine.integrations.otel.sdk import to_spans
from engine.integrations.otel.trace import SpanRecord, State, flush, step
from events import Event, RunStarted, StagetrailError
from projections import Projection

if TYPE_CHECKING:
    from engine import Engine

BATCH = 512
"""Spans handed to the exporter per call (the SDK's batch processor's default)."""
_DEPTH = 1000
"""The deepest parent chain followed to find a trace's root run."""


class OtelExportFailed(StagetrailError, RuntimeError):
    """The span exporter did not deliver a batch of spans (the receiver is down or refused it).

    Attributes:
        spans: how many spans the failed batch held.
    """

    def __init__(self, spans: int) -> None:
        self.spans = spans
        super().__init__(
            f"the OpenTelemetry exporter failed to deliver {spans} span(s); "
            "check the endpoint and try again"
        )


class RunRoots:
    """Finds each run's top ancestor (its trace), reading `RunStarted` events once per run."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._parents: dict[str, str | None] = {}

    def __call__(self, run_id: str) -> str:
        """The root run of `run_id`'s tree (itself when it has no parent)."""
        current = run_id
        for _ in range(_DEPTH):
            parent = self._parent(current)
            if parent is None:
                return current
            current = parent
        return current

    def learn(self, started: RunStarted) -> None:
        """Note a run's parent from its `RunStarted` (no read needed later)."""
        parent = started.parent_run_id
        self._parents[str(started.run_id)] = None if parent is None else str(parent)

    def _parent(self, run_id: str) -> str | None:
        if run_id not in self._parents:
            first = self._engine.store.read(UUID(run_id), lte=1)
            parent = first[0].parent_run_id if first and isinstance(first[0], RunStarted) else None
            self._parents[run_id] = None if parent is None else str(parent)
        return self._parents[run_id]


@attrs.frozen
class Exported:
    """What `export_runs` sent: the runs and the spans."""

    runs: int
    spans: int


def run_spans(events: Iterable[Event]) -> list[SpanRecord]:
    """Every span of one run's events; what is still open is ended at the newest event."""
    state: State = None
    spans: list[SpanRecord] = []
    for event in events:
        state, ended = step(state, event)
        spans += ended
    return spans + flush(state)


def export_runs(
    engine: Engine,
    run_ids: Sequence[UUID],
    exporter: SpanExporter,
    *,
    children: bool = True,
    service: str = "stagetrail",
    passing_gone: bool = False,
) -> Exported:
    """Export the runs (and with `children` their child runs) as traces through `exporter`;
    with `passing_gone`, those erased (or being erased) since they were chosen are passed
    over (each run's spans are read whole before any is delivered).

    Raises:
        RunNotFound: a run is not in the store.
        RunBeingErased: a compaction has begun erasing a run.
        OtelExportFailed: the exporter failed; the batches before it were delivered.
    """
    roots = RunRoots(engine)
    runs = 0
    pending: list[SpanRecord] = []
    sent = 0
    for run_id in _chosen(engine, run_ids, children, passing_gone):
        try:
            pending += run_spans(engine.store.stream(run_id))
        except RunBeingErased:
            if not passing_gone:
                raise
            continue
        runs += 1
        while len(pending) >= BATCH:
            sent += deliver(exporter, pending[:BATCH], roots, service)
            del pending[:BATCH]
    if pending:
        sent += deliver(exporter, pending, roots, service)
    return Exported(runs, sent)


def _chosen(
    engine: Engine, run_ids: Sequence[UUID], children: bool, passing_gone: bool
) -> Iterator[UUID]:
    seen: set[UUID] = set()
    for run_id in run_ids:
        try:
            members = engine.tree(run_id)  # raises RunNotFound
        except (RunNotFound, RunBeingErased):
            if not passing_gone:
                raise
            continue
        for member in members if children else members[:1]:
            if member not in seen:
                seen.add(member)
                yield member


def deliver(
    exporter: SpanExporter, records: Sequence[SpanRecord], roots: RunRoots, service: str
) -> int:
    """Hand `records` to `exporter` as the SDK's spans; how many.

    Raises:
        OtelExportFailed: the exporter reported a failure.
    """
    if not records:
        return 0
    if exporter.export(to_spans(records, roots, service)) is not SpanExportResult.SUCCESS:
        raise OtelExportFailed(len(records))
    return len(records)


class OtelTraces(Projection[State]):
    """The live export: a persistent projection of each run's trace state that exports the
    spans each page of events ended, before its progress is recorded.

    Args:
        engine: the engine it is registered with (to find child runs' traces).
        exporter: where spans go (e.g. the SDK's `OTLPSpanExporter`).
        service: the ``service.name`` of the spans' resource.
    """

    name = "otel_traces"
    scope = "run"
    delivers = True
    __slots__ = ("_exporter", "_roots", "_service")  # not settings: identity stays the code's

    def __init__(self, engine: Engine, exporter: SpanExporter, service: str = "stagetrail") -> None:
        self._exporter = exporter
        self._roots = RunRoots(engine)
        self._service = service

    def initial(self) -> State:
        """No run seen yet."""
        return None

    def apply(self, state: State, event: Event) -> State:
        """The run's trace state after `event`."""
        return step(state, event)[0]

    def settled(self, state: State) -> bool:
        """A finished run's trace takes no more spans."""
        return state is not None and bool(state.get("finished"))

    def deliver(self, folded: Sequence[tuple[State, Event]]) -> None:
        """Export the spans the page's events ended.

        Raises:
            OtelExportFailed: the page is folded and exported again later.
        """
        records: list[SpanRecord] = []
        for before, event in folded:
            if isinstance(event, RunStarted):
                self._roots.learn(event)
            records += step(before, event)[1]
        for start in range(0, len(records), BATCH):
            deliver(self._exporter, records[start : start + BATCH], self._roots, self._service)

    def __repr__(self) -> str:
        return f"<projection {self.name!r} to {type(self._exporter).__name__}>"


def otlp_exporter(endpoint: str | None = None) -> OTLPSpanExporter:
    """The SDK's OTLP/HTTP span exporter for `endpoint` (a collector's base URL, or its
    traces URL); None: OpenTelemetry's environment variables, else localhost:4318."""
    return OTLPSpanExporter(endpoint=None if endpoint is None else traces_url(endpoint))


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for `endpoint` (a collector's base URL, or its traces URL)."""
    if urlsplit(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def memory_exporter() -> InMemorySpanExporter:
    """The SDK's in-memory span exporter (what `stagetrail otel --json` prints, and tests)."""
    return InMemorySpanExporter()


def exported_fields(span: Any) -> dict[str, Any]:
    """A finished span as plain JSON (for `stagetrail otel --json` and the docs)."""
    return {
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "name": span.name,
        "start": span.start_time,
        "end": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": e.name, "time": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events
        ],
    }
