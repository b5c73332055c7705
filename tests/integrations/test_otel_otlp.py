"""OpenTelemetry export over OTLP/HTTP to a receiver the tests start, which decodes what it gets."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from engine import Engine
from engine.integrations.otel import OtelTraces, export_runs, otlp_exporter, span_id
from tests._helpers import REVIEW
from tests.cli._helpers import ok
from tests.integrations.test_otel import recorded


class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1: each request decoded with opentelemetry-proto."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                received.requests.append(request)
                received.paths.append(self.path)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[Any]:
        """Every span received, in order, with the resource's attributes it came under."""
        return [
            span
            for request in self.requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]

    def services(self) -> set[str]:
        """The service.name of every resource received."""
        return {
            value(attribute.value)
            for request in self.requests
            for resource_spans in request.resource_spans
            for attribute in resource_spans.resource.attributes
            if attribute.key == "service.name"
        }

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def value(any_value: AnyValue) -> Any:
    """The Python value of a decoded attribute."""
    return getattr(any_value, str(any_value.WhichOneof("value")))


def attributes(span: Any) -> dict[str, Any]:
    return {attribute.key: value(attribute.value) for attribute in span.attributes}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    yield started
    started.close()


class TestOverOtlp:
    def test_the_receiver_decodes_the_runs_trace(self, sqlite_url: str, receiver: Receiver) -> None:
        """Sent over OTLP/HTTP, the spans decode with the run's trace id, parents, attributes,
        status and span events."""
        with Engine(sqlite_url) as engine:
            run_id, child_id = recorded(engine)
            exporter = otlp_exporter(receiver.url)
            done = export_runs(engine, [run_id], exporter, service="reviews")
            exporter.shutdown()  # type: ignore[no-untyped-call]
        spans = receiver.spans()
        assert receiver.paths == ["/v1/traces"]
        assert receiver.services() == {"reviews"}
        assert len(spans) == done.spans == 8  # 5 attempts, the child's 1, the two runs' spans
        assert {bytes(s.trace_id) for s in spans} == {run_id.bytes}
        root = next(s for s in spans if not s.parent_span_id)
        assert int.from_bytes(root.span_id, "big") == span_id(str(run_id), "run")
        assert root.name == "run code-review"
        assert root.status.code == 2  # STATUS_CODE_ERROR: aborted_stuck
        assert [e.name for e in root.events] == [
            "retry_scheduled", "circuit_opened", "rolled_back", "verdict",
        ]  # fmt: skip
        assert attributes(root)["stagetrail.label.team"] == "core"
        failed = next(s for s in spans if s.name == "developer #1")
        assert failed.parent_span_id == root.span_id
        assert (failed.status.code, failed.status.message) == (2, "syntax error")
        assert attributes(failed)["error.type"] == "ValueError"
        child_span = span_id(str(child_id), "run").to_bytes(8, "big")
        child = next(s for s in spans if s.span_id == child_span)
        assert child.parent_span_id == root.span_id
        assert failed.end_time_unix_nano - failed.start_time_unix_nano == 3_000_000_000

    def test_the_command_sends_to_the_endpoint(self, sqlite_url: str, receiver: Receiver) -> None:
        """stagetrail otel --all --endpoint URL sends every run's spans and says how many."""
        with Engine(sqlite_url) as engine:
            recorded(engine)
        out = ok("otel", "--all", "--endpoint", receiver.url, "--store", sqlite_url)
        assert "exported 8 span(s) of 2 run(s)" in out
        assert len(receiver.spans()) == 8

    def test_the_follower_sends_each_span_once(self, shared_url: str, receiver: Receiver) -> None:
        """The live follower over OTLP: spans arrive as events are recorded, none twice."""
        with Engine(shared_url) as engine:
            exporter = otlp_exporter(receiver.url)
            engine.projections.register(OtelTraces(engine, exporter))
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis")
            engine.projections.catch_up()
            run.stage_completed("code_review")
            run.finish("succeeded")
            engine.projections.catch_up()
            engine.projections.catch_up()
            exporter.shutdown()  # type: ignore[no-untyped-call]
        names = [s.name for s in receiver.spans()]
        assert names == ["project_analysis #1", "code_review #1", "run code-review"]
        assert len(receiver.requests) == 2
