"""Live OpenTelemetry export under 8 writer processes: the follower's lag, and how fast it is
back to 0 once the writers stop.

Eight `benchmarks.fleet` workers supervise runs on one store while this process
follows it with `OtelTraces` registered (an OTLP/HTTP exporter to a receiver in
this process that decodes and counts the spans), sampling the projection's lag
(head minus its position, in events) four times a second. When the writers are
done, it times how long the lag takes to reach 0.

Run: ``python -m benchmarks.otel`` (``--quick`` for a smoke run; needs the
``otel`` extra).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from benchmarks._common import arguments, report, scratch
from benchmarks.fleet import start
from engine import Engine
from engine.integrations.otel import OtelTraces, otlp_exporter


class Receiver:
    """An OTLP/HTTP traces endpoint that decodes each request and counts its spans."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans = 0
        received = self
        reply = ExportTraceServiceResponse().SerializeToString()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                received.spans += sum(
                    len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans
                )
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def lag_of(engine: Engine) -> int:
    """The OpenTelemetry projection's lag, in events."""
    (status,) = [s for s in engine.projections.status() if s.name == OtelTraces.name]
    return status.lag


def measure(writers: int, runs: int) -> dict[str, Any]:
    """Follow `writers` fleet workers with the live export; its lag and catch-up time."""
    url = f"sqlite:///{scratch('otel.db')}"
    receiver = Receiver()
    with Engine(url) as engine:
        exporter = otlp_exporter(receiver.url)
        engine.projections.register(OtelTraces(engine, exporter))
        stop = threading.Event()
        follower = threading.Thread(
            target=engine.projections.follow, args=(stop,), kwargs={"timeout": 0.2}
        )
        follower.start()
        workers = [start("worker", url, "--index", str(i), "--runs", str(runs))
                   for i in range(writers)]  # fmt: skip
        samples = []
        while any(worker.poll() is None for worker in workers):
            samples.append(lag_of(engine))
            time.sleep(0.25)
        began = time.perf_counter()
        while lag_of(engine) > 0 and time.perf_counter() - began < 60:
            time.sleep(0.01)
        catch_up = time.perf_counter() - began
        stop.set()
        follower.join()
        events = engine.projections.head()
        exporter.shutdown()  # type: ignore[no-untyped-call]
    receiver.server.shutdown()
    return {
        "case": f"live export, {writers} writer processes, SQLite",
        "events": events,
        "spans": receiver.spans,
        "max_lag": max(samples, default=0),
        "mean_lag": sum(samples) / len(samples) if samples else 0,
        "catch_up_s": catch_up,
        "target_catch_up_s": 1.0,
    }


def main() -> None:
    """Measure and print the live export's lag."""
    options = arguments(__doc__.splitlines()[0])
    writers, runs = (2, 5) if options.quick else (8, 40)
    report("OpenTelemetry live export", [measure(writers, runs)], options.json)


if __name__ == "__main__":
    main()
