"""benchmarks.chain still runs (smoke mode); its figures live in docs/performance.md."""

from __future__ import annotations

import json

import pytest

from tests.test_benchmarks import quick_run


@pytest.mark.slow
class TestChainBenchmark:
    def test_every_figure_is_reported(self) -> None:
        """benchmarks.chain --quick prints the append ratio, the serialisation cost and the
        chain check's rate with their targets."""
        rows = json.loads(quick_run("chain").stdout)["results"]
        assert [row["case"].split(",")[0] for row in rows] == [
            "batched append", "serialise one event", "check the chain of a 5",
        ]  # fmt: skip
        assert rows[0]["with_links"] > 0
        assert rows[0]["target"] == 0.95
        assert rows[2]["events_s"] > 0
        assert rows[2]["target"] == 500_000


@pytest.mark.slow
class TestOtelBenchmark:
    def test_the_live_exports_lag_is_reported(self) -> None:
        """benchmarks.otel --quick follows writer processes and reports its lag and catch-up."""
        pytest.importorskip("opentelemetry.sdk")
        (row,) = json.loads(quick_run("otel").stdout)["results"]
        assert row["events"] > 0
        assert row["spans"] > 0
        assert row["target_catch_up_s"] == 1.0
