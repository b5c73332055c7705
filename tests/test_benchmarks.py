"""The benchmarks still run (smoke mode); their figures live in docs/performance.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
class TestBenchmarks:
    def test_append_benchmark_reports_every_case(self) -> None:
        """benchmarks.append --quick prints each case with its ratio and target."""
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.append", "--quick", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        report = json.loads(done.stdout)
        cases = [row["case"] for row in report["results"]]
        assert cases[0] == "durable single append"
        assert cases[1] == "batched append, 100/transaction"
        assert all(row["stagetrail"] > 0 for row in report["results"][:2])
        assert report["results"][2]["many_tasks"] > 0
        assert report["results"][3]["append"] < 200
