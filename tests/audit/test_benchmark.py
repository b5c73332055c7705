"""benchmarks.chain still runs (smoke mode); its figures live in docs/performance.md."""

from __future__ import annotations

import json

import pytest

from tests.test_benchmarks import quick_run


@pytest.mark.slow
class TestChainBenchmark:
    def test_every_figure_is_reported(self) -> None:
        """benchmarks.chain --quick prints the append ratios (batched, durable, compare's
        workload), the serialisation cost, the chain check's rate with its target, floors and
        the rate fed StoredEvent pages, memory-mapped and keyed, the whole verify's, and
        PostgreSQL's where it answers; the chain checks also with worker processes."""
        rows = json.loads(quick_run("chain").stdout)["results"]
        postgres = ["check the chain of that run"] if len(rows) == 10 else []
        assert [row["case"].split(",")[0] for row in rows] == [
            "batched append", "durable single append", "compare's workload",
            "compare's workload", "serialise one event", "check the chain of a 5",
            "the same", "the same", "the whole verify of that run", *postgres,
        ]  # fmt: skip
        for row in rows[5:8] + rows[9:]:
            assert row["cpu_events_s_min"] <= row["cpu_events_s"] <= row["cpu_events_s_max"]
            assert row["preempted"] >= 0
            assert row["waited"] >= 0
        for row in rows[:4]:
            assert row["ratio_min"] <= row["ratio"] <= row["ratio_max"]
            assert row["cpu_ratio_min"] <= row["cpu_ratio"] <= row["cpu_ratio_max"]
        assert rows[0]["target"] == 0.95
        assert rows[5]["events_s"] > 0
        assert rows[5]["target"] == 500_000
        assert rows[5]["cpu_events_s"] > 0
        assert rows[5]["read_alone_cpu_events_s"] > 0
        assert rows[5]["read_stored_events_alone_cpu_events_s"] > 0
        assert rows[5]["through_stored_events_cpu_events_s"] > 0
        assert rows[5]["cpu_events_s_min"] <= rows[5]["cpu_events_s"] <= rows[5]["cpu_events_s_max"]
        for row in [rows[5], rows[7], *rows[9:]]:  # the --quick run is too short for workers
            assert (row["workers"], row["with_workers_events_s"] > 0) == (0, True)
            assert row["with_workers_cpu_events_s"] > 0
        assert rows[8]["events_s"] > 0
        assert rows[8]["peak_rss_mb"] > 0
        assert rows[5]["peak_rss_mb"] > 0


@pytest.mark.slow
class TestOtelBenchmark:
    def test_the_live_exports_lag_is_reported(self) -> None:
        """benchmarks.otel --quick follows writer processes and reports its lag and catch-up."""
        pytest.importorskip("opentelemetry.sdk")
        (row,) = json.loads(quick_run("otel").stdout)["results"]
        assert row["events"] > 0
        assert row["spans"] > 0
        assert row["target_catch_up_s"] == 1.0
