"""Runs as OpenTelemetry traces, checked with the SDK's in-memory exporter."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

from engine import Engine
from engine.integrations.otel import (
    OtelTraces,
    export_runs,
    memory_exporter,
    span_id,
    traces_url,
)
from events import CircuitOpened, RetryScheduled
from tests._helpers import REVIEW
from tests.cli._helpers import ok


def recorded(engine: Engine) -> tuple[UUID, UUID]:
    """A run with a retry, a breaker change, a rollback, a finished child run and a verdict."""
    run = engine.start_run(REVIEW, labels={"team": "core", "card": "C-42"})
    run.stage_started("project_analysis")
    run.stage_completed("project_analysis", result={"type": "python"}, duration=2.0)
    run.stage_completed("code_review", duration=1.0)
    run.stage_failed("developer", error=ValueError("syntax error"), duration=3.0)
    run.record(RetryScheduled, stage="developer", attempt=2, delay=1.5, reason="retryable")
    run.record(CircuitOpened, stage="developer", reason="3 failures")
    child = engine.start_run(REVIEW, parent=run, labels={"feature": "f1"})
    child.stage_completed("project_analysis", duration=0.5)
    child.finish("succeeded")
    run.stage_completed("developer", duration=4.0)
    run.rollback(1, reason="bad patch")
    run.stage_completed("developer", duration=2.0)
    run.finish("aborted_stuck", reason="no progress")
    return run.id, child.id


def exported(engine: Engine, run_ids: list[UUID], **options: Any) -> list[ReadableSpan]:
    memory = memory_exporter()
    export_runs(engine, run_ids, memory, **options)
    return list(memory.get_finished_spans())


def by_name(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


class TestOnDemand:
    def test_a_run_is_a_trace_and_each_attempt_a_span(self, engine: Engine) -> None:
        """The run's span is the root; each attempt a child span named stage #attempt, in the
        trace whose id is the run's id."""
        run_id, _ = recorded(engine)
        spans = exported(engine, [run_id], children=False)
        named = by_name(spans)
        root = named["run code-review"]
        assert root.parent is None
        assert {s.context.trace_id for s in spans} == {run_id.int}
        attempts = [s.name for s in spans if s.name != "run code-review"]
        assert attempts == [
            "project_analysis #1", "code_review #1", "developer #1", "developer #2", "developer #3",
        ]  # fmt: skip
        assert all(s.parent.span_id == root.context.span_id for s in spans if s is not root)  # type: ignore[union-attr]

    def test_an_attempt_span_carries_stage_attempt_outcome_duration_and_error(
        self, engine: Engine
    ) -> None:
        """A failed attempt is an error span with its error type, message and an exception
        event; a started attempt spans from its StageStarted to its outcome."""
        run_id, _ = recorded(engine)
        named = by_name(exported(engine, [run_id], children=False))
        failed = named["developer #1"]
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.status.description == "syntax error"
        assert dict(failed.attributes or {}) == {
            "stagetrail.stage": "developer",
            "stagetrail.attempt": 1,
            "stagetrail.outcome": "failed",
            "stagetrail.duration": 3.0,
            "stagetrail.version": 5,
            "error.type": "ValueError",
            "stagetrail.retryable": True,
        }
        (exception,) = failed.events
        assert exception.name == "exception"
        assert exception.attributes == {
            "exception.message": "syntax error",
            "exception.type": "ValueError",
        }
        assert named["code_review #1"].status.status_code is StatusCode.UNSET
        first = named["project_analysis #1"]
        events = engine.events(run_id)
        assert first.start_time == int(events[1].timestamp.timestamp() * 1e6) * 1000
        assert first.end_time == int(events[2].timestamp.timestamp() * 1e6) * 1000

    def test_retries_breaker_rollback_and_verdict_are_events_of_the_runs_span(
        self, engine: Engine
    ) -> None:
        """The run span holds a span event per retry, breaker change, rollback and the verdict,
        and the labels as attributes; a stuck run's span is an error."""
        run_id, _ = recorded(engine)
        root = by_name(exported(engine, [run_id], children=False))["run code-review"]
        names = [event.name for event in root.events]
        assert names == ["retry_scheduled", "circuit_opened", "rolled_back", "verdict"]
        retry = root.events[0].attributes or {}
        assert (retry["stagetrail.delay"], retry["stagetrail.attempt"]) == (1.5, 2)
        verdict = root.events[3].attributes or {}
        assert (verdict["stagetrail.status"], verdict["stagetrail.reason"]) == (
            "aborted_stuck", "no progress",
        )  # fmt: skip
        attributes = dict(root.attributes or {})
        assert attributes["stagetrail.label.team"] == "core"
        assert attributes["stagetrail.label.card"] == "C-42"
        assert attributes["stagetrail.status"] == "aborted_stuck"
        assert root.status.status_code is StatusCode.ERROR

    def test_a_child_run_is_a_child_span_in_its_parents_trace(self, engine: Engine) -> None:
        """The child run's span is a child of the parent run's span, in the parent's trace."""
        run_id, child_id = recorded(engine)
        spans = exported(engine, [run_id])
        roots = [s for s in spans if s.name == "run code-review"]
        parent_span = next(s for s in roots if s.parent is None)
        child_span = next(s for s in roots if s.parent is not None)
        assert child_span.parent.span_id == parent_span.context.span_id  # type: ignore[union-attr]
        assert child_span.context.trace_id == run_id.int
        assert dict(child_span.attributes or {})["stagetrail.parent_run_id"] == str(run_id)
        assert span_id(str(child_id), "run") == child_span.context.span_id
        under_child = [s.name for s in spans if s.parent and s.parent == child_span.context]
        assert under_child == ["project_analysis #1"]

    def test_a_running_run_is_exported_up_to_its_newest_event(self, engine: Engine) -> None:
        """A run not finished yet: its span ends at its newest event, marked running, and an
        open attempt is a span marked open."""
        run = engine.start_run(REVIEW)
        run.stage_started("project_analysis")
        named = by_name(exported(engine, [run.id]))
        assert dict(named["run code-review"].attributes or {})["stagetrail.status"] == "running"
        assert dict(named["project_analysis #1"].attributes or {})["stagetrail.open"] is True

    def test_exporting_twice_gives_the_same_ids(self, engine: Engine) -> None:
        """Span and trace ids depend on the run alone: a receiver keeps one copy of each."""
        run_id, _ = recorded(engine)
        first = [(s.context.trace_id, s.context.span_id) for s in exported(engine, [run_id])]
        assert first == [
            (s.context.trace_id, s.context.span_id) for s in exported(engine, [run_id])
        ]
        assert len(set(first)) == len(first)

    def test_a_fork_links_to_its_origin(self, engine: Engine) -> None:
        """A forked run's span links to the origin run's span."""
        run_id, _ = recorded(engine)
        fork = engine.fork(run_id, at=3)
        root = by_name(exported(engine, [fork.id]))["run code-review"]
        (link,) = root.links
        assert (link.context.trace_id, link.context.span_id) == (
            run_id.int,
            span_id(str(run_id), "run"),
        )

    def test_traces_url(self) -> None:
        """A collector's base URL gets OTLP's traces path; a full URL is kept."""
        assert traces_url("http://h:4318") == "http://h:4318/v1/traces"
        assert traces_url("http://h:4318/") == "http://h:4318/v1/traces"
        assert traces_url("http://h/custom/traces") == "http://h/custom/traces"


class Flaky(SpanExporter):
    """An exporter that fails while `down`, and keeps what it was given otherwise."""

    def __init__(self) -> None:
        self.down = False
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Any) -> SpanExportResult:
        if self.down:
            return SpanExportResult.FAILURE
        self.spans += list(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


class TestFollower:
    def test_each_span_is_exported_once_as_events_arrive(self, store_url: str) -> None:
        """Registered as a persistent projection, each catch-up exports only the spans the new
        events ended; the run's span at its finish."""
        with Engine(store_url) as engine:
            sink = Flaky()
            engine.projections.register(OtelTraces(engine, sink))
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis")
            engine.projections.catch_up()
            assert [s.name for s in sink.spans] == ["project_analysis #1"]
            engine.projections.catch_up()
            assert len(sink.spans) == 1
            run.stage_completed("code_review")
            run.finish("succeeded")
            engine.projections.catch_up()
            assert [s.name for s in sink.spans] == [
                "project_analysis #1", "code_review #1", "run code-review",
            ]  # fmt: skip

    def test_a_receiver_down_holds_the_page_back_until_it_is_up(self, store_url: str) -> None:
        """A failed export is the projection's error; its position stays, and the next
        catch-up exports the same spans once the receiver answers."""
        with Engine(store_url) as engine:
            sink = Flaky()
            engine.projections.register(OtelTraces(engine, sink))
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis")
            sink.down = True
            with pytest.raises(Exception, match="failed to deliver"):
                engine.projections.catch_up()
            (status,) = [s for s in engine.projections.status() if s.name == "otel_traces"]
            assert status.lag > 0
            assert "failed to deliver" in str(status.last_error)
            sink.down = False
            engine.projections.catch_up()
            assert [s.name for s in sink.spans] == ["project_analysis #1"]

    def test_a_new_follower_goes_on_where_the_last_stopped(self, shared_url: str) -> None:
        """The progress is the store's: a follower in a new engine exports only new spans."""
        with Engine(shared_url) as engine:
            first = Flaky()
            engine.projections.register(OtelTraces(engine, first))
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis")
            engine.projections.catch_up()
            run_id = run.id
        with Engine(shared_url) as engine:
            second = Flaky()
            engine.projections.register(OtelTraces(engine, second))
            engine.load(run_id).stage_completed("code_review")
            engine.projections.catch_up()
            assert [s.name for s in first.spans] == ["project_analysis #1"]
            assert [s.name for s in second.spans] == ["code_review #1"]


class TestCommand:
    def test_json_prints_the_spans(self, sqlite_url: str) -> None:
        """stagetrail otel RUN --json prints one JSON object per span, the run and its child."""
        with Engine(sqlite_url) as engine:
            run_id, _ = recorded(engine)
        lines = [
            json.loads(line)
            for line in ok("otel", str(run_id), "--json", "--store", sqlite_url).splitlines()
        ]
        assert {line["trace_id"] for line in lines} == {f"{run_id.int:032x}"}
        assert sum(line["name"] == "run code-review" for line in lines) == 2
        every = ok("otel", "--all", "--json", "--store", sqlite_url).splitlines()
        assert len(every) == len(lines)  # the child comes with its parent, once
