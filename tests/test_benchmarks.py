"""The benchmarks still run (smoke mode); their figures live in docs/performance.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from projections import BUILT_INS
from tests._helpers import require_postgres

ROOT = Path(__file__).resolve().parent.parent


def quick_run(name: str, *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m benchmarks.<name> --quick --json`` from the repository root."""
    command = [sys.executable, "-m", f"benchmarks.{name}", "--quick", "--json", *options]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)


@pytest.mark.slow
class TestBenchmarks:
    def test_alternating_benchmark_records_and_reads_each_size(self) -> None:
        """benchmarks/alternating.py records and reads one alternating run per size, its
        machine at half the run answered from the writer's snapshots."""
        command = [sys.executable, "-P", "benchmarks/alternating.py", "--sizes", "6000"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.splitlines()[-1])
        assert row["events"] == 6000
        assert row["mb"] > 0
        assert row["read_machine_half_ms"] > 0
        assert row["read_rss_mb"] < 200

    def test_append_benchmark_reports_every_case(self) -> None:
        """benchmarks.append --quick prints each case with its ratio and target."""
        done = quick_run("append")
        report = json.loads(done.stdout)
        cases = [row["case"] for row in report["results"]]
        assert cases[0] == "durable single append"
        assert cases[1] == "batched append, 100/transaction"
        assert all(row["stagetrail"] > 0 for row in report["results"][:2])
        assert report["results"][2]["many_tasks"] > 0
        assert report["results"][3]["append"] < 200

    def test_chain_read_benchmark_reports_every_read(self) -> None:
        """benchmarks.chain_read --quick prints each read's rates, then verify's and the check's."""
        require_postgres()
        rows = json.loads(quick_run("chain_read").stdout)["results"]
        assert [row["case"] for row in rows[:3]] == [
            "chunked stream (RangeReader)",
            "chunked stream, no topic",
            "server-side cursor, 20,000 a fetch",
        ]
        assert all(row["wall"] > 0 and row["cpu"] > 0 for row in rows[:7])
        assert rows[6]["case"] == "verify"
        assert rows[7]["cpu"] > 0

    def test_projections_benchmark_reports_every_figure(self) -> None:
        """benchmarks.projections --quick prints each figure with its baseline and target."""
        done = quick_run("projections")
        rows = json.loads(done.stdout)["results"]
        cases = [row["case"] for row in rows]
        assert cases[0].startswith("on-demand fold")
        assert cases[1].startswith("time travel, warm")
        assert cases[2].startswith("time travel, cold:")
        assert cases[3].startswith("time travel, cold, RetryCounts")
        assert cases[4].startswith("rebuild run_index + failure_patterns")
        assert cases[5].startswith("engine.runs(limit=100)")
        assert all("target" in row and isinstance(row["met"], bool) for row in rows)
        assert min(rows[0]["fold"], rows[0]["read_decode"]) > 0
        assert min(rows[1]["median"], rows[2]["median"], rows[3]["median"]) > 0
        assert min(rows[4]["rebuild"], rows[4]["raw_sqlite3_json"]) > 0
        assert rows[5]["same_answer"] is True
        assert "rebuild: 100%" in done.stderr

    def test_cli_benchmark_reports_every_figure(self) -> None:
        """benchmarks.cli --quick prints start-up, runs and show figures with their targets."""
        done = quick_run("cli")
        rows = json.loads(done.stdout)["results"]
        cases = [row["case"] for row in rows]
        assert cases[0].startswith("stagetrail --version")
        assert cases[1].startswith("stagetrail --help")
        assert cases[2].endswith("first call: index catches up (s)")
        assert cases[3].startswith("stagetrail runs --limit 50")
        assert cases[4].startswith("stagetrail show, 300-event run (ms)")
        assert cases[5].startswith("stagetrail show")
        assert cases[6].startswith("stagetrail show")
        assert rows[0]["import_engine_cli"] > 0
        assert [row["target"] for row in rows[:2] + rows[3:5]] == [150, 150, 400, 500]
        assert all(row["median"] > 0 and row["python_c_pass"] > 0 for row in rows[:2] + rows[3:5])
        assert isinstance(rows[3]["met"], bool)
        assert all(row["peak_rss"] > 0 and row["target"] == 200 for row in rows[5:])

    def test_supervise_benchmark_reports_both_stores(self) -> None:
        """benchmarks.supervise --quick compares supervised and hand recording per store."""
        done = quick_run("supervise")
        rows = json.loads(done.stdout)["results"]
        assert [row["case"].split(" ")[0] for row in rows] == [
            "supervised", "supervised_all_policies", "supervised", "supervised_all_policies",
        ]  # fmt: skip
        assert all(row["by_hand"] > 0 and row["supervised"] > 0 for row in rows)
        assert isinstance(rows[0]["met"], bool)
        assert rows[2]["met"] is None

    def test_concurrent_benchmark_reports_shared_commits(self) -> None:
        """benchmarks.concurrent --quick compares shared commits with each run's own, per size."""
        done = quick_run("concurrent")
        rows = json.loads(done.stdout)["results"]
        assert [row["runs_at_once"] for row in rows] == [1, 10, 100]
        assert all(row["each_runs_per_s"] > 0 and row["shared_runs_per_s"] > 0 for row in rows)
        assert rows[0]["commits_per_run_shared"] == rows[0]["commits_per_run_each"] == 9
        assert rows[2]["commits_per_run_shared"] < 2  # a run's start, and a share of 8 commits

    def test_floor_benchmark_reports_the_fsync_floor_and_the_cpu(self) -> None:
        """benchmarks.floor --quick prints fsync costs, a run's time, CPU, its replayed commits."""
        done = quick_run("floor")
        rows = json.loads(done.stdout)["results"]
        assert [row["median"] > 0 for row in rows[:3]] == [True] * 3
        run = rows[3]
        assert run["commits"] == 9
        # Both times are reported; which is smaller is a speed claim, the benchmark's to
        # make: under a second pytest worker a run without fsyncs was once the slower.
        assert run["without_fsync"] > 0
        assert run["shipped"] > 0
        assert run["cpu_shipped"] > 0
        assert run["commits_replayed"] > 0

    def test_tasks_benchmark_reports_every_size(self) -> None:
        """benchmarks.tasks --quick prints µs per task per store and size, and a ratio."""
        done = quick_run("tasks")
        rows = json.loads(done.stdout)["results"]
        sizes = [(row["store"], row["tasks"]) for row in rows[:-1]]
        assert sizes == [("memory", 100), ("memory", 1_000), ("sqlite", 100), ("sqlite", 1_000)]
        assert all(row["us_per_task"] > 0 for row in rows[:-1])
        assert rows[-1]["case"].startswith("flatness")
        assert rows[-1]["ratio"] > 0
        assert rows[-1]["met"] is None  # the target is judged on the full sizes only

    def test_tables_benchmark_reports_growth(self) -> None:
        """benchmarks.tables --quick prints from_dict's and load's doubling ratios."""
        rows = json.loads(quick_run("tables").stdout)["results"]
        assert [row["case"].split(",")[0] for row in rows] == ["Pipeline.from_dict", "engine.load"]
        assert all(row["doubling_ratio"] > 0 for row in rows)

    def test_scale_benchmark_reports_both_curves(self) -> None:
        """benchmarks.scale --quick prints events/s and follower lag per writer count."""
        done = quick_run("scale")
        rows = json.loads(done.stdout)["results"]
        curves = [row["case"] for row in rows[:-1]]
        assert curves[:2] == ["sqlite, 1 writer(s)", "sqlite, 2 writer(s)"]
        assert curves[2:] in ([], ["postgresql, 1 writer(s)", "postgresql, 2 writer(s)"])
        assert all(row["events_per_s"] > 0 and row["max_lag"] >= 0 for row in rows[:-1])
        assert rows[0]["speedup"] == 1.0
        assert rows[-1]["case"] == "machine"
        assert rows[-1]["cpus"] > 0

    def test_shards_benchmark_reports_every_case(self) -> None:
        """benchmarks.shards --quick prints recording and each read over 1, 2 and 4 stores."""
        require_postgres()
        rows = json.loads(quick_run("shards").stdout)["results"]
        cases = [row["case"] for row in rows]
        assert cases[0].startswith("record runs")
        assert cases[1:3] == ["runs(limit=50)", "runs(limit=50, offset=100)"]
        assert cases[-1] == "load(run_id) by its shard's own Engine"
        assert all(row["2 shards x"] > 0 and row["4 shards x"] > 0 for row in rows)

    def test_langgraph_benchmark_reports_every_figure(self) -> None:
        """benchmarks.langgraph --quick prints speed, sizes and history against SqliteSaver."""
        pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs the langgraph extra")
        rows = json.loads(quick_run("langgraph").stdout)["results"]
        cases = [row["case"] for row in rows]
        assert cases[0] == "super-steps/s"
        assert cases[1].startswith("bytes on disk per run, 1024 B")
        assert cases[2].startswith("bytes a run adds, 1024 B")
        assert cases[3].startswith("same, store with ?compress=zlib")
        assert cases[4].startswith("added, store with ?compress=zlib")
        assert cases[-2] == "process CPU per super-step (ms), retried by RetryPolicy"
        assert cases[-1].startswith("get_state_history")
        assert all(row["SqliteSaver"] > 0 and row["StagetrailSaver"] > 0 for row in rows)
        assert all(isinstance(row["met"], bool) for row in rows)

    def test_saver_calls_benchmark_replays_both_savers(self) -> None:
        """benchmarks.saver_calls --quick replays LangGraph's captured calls on both savers."""
        pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs the langgraph extra")
        rows = json.loads(quick_run("saver_calls").stdout)["results"]
        assert [row["case"] for row in rows] == [
            "saver CPU per super-step (µs), RetryPolicy calls replayed"
        ]
        assert rows[0]["SqliteSaver"] > 0
        assert rows[0]["StagetrailSaver"] > 0
        assert rows[0]["super-steps per thread"] == 8
        assert rows[0]["calls per thread"] >= 8  # a read, and a save per super-step at least

    def test_saver_calls_never_overwrites_an_events_file(self, tmp_path: Path) -> None:
        """benchmarks.saver_calls --events refuses a file that exists and leaves it as it was."""
        kept = tmp_path / "rows.txt"
        kept.write_text("someone's rows\n")
        command = [sys.executable, "-m", "benchmarks.saver_calls", "--events", str(kept)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 1
        assert "exists" in done.stderr
        assert kept.read_text() == "someone's rows\n"


class TestCompare:
    def test_compare_reports_every_installed_system(self) -> None:
        """benchmarks.compare --quick measures raw, eventsourcing and both stagetrail variants."""
        command = [sys.executable, "-m", "benchmarks.compare", "--quick", "--json", "--only",
                   "raw", "eventsourcing", "stagetrail-run", "stagetrail-drive"]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        report = json.loads(done.stdout)
        rows = {row["key"]: row for row in report["results"]}
        assert list(rows) == ["raw", "eventsourcing", "stagetrail-run", "stagetrail-drive"]
        assert all(row["runs_s"] > 0 and row["bytes_run"] > 0 for row in rows.values())
        assert rows["raw"]["runs_s_vs_raw"] == 1.0
        assert rows["raw"]["records_run"] == 18
        assert all(row["failures_visible"] for row in rows.values())
        assert report["environment"]["versions"]["eventsourcing"]

    def test_long_runs_benchmark_reports_every_column(self) -> None:
        """benchmarks.long_runs --quick prints each size's row and the scaling between them."""
        rows = json.loads(quick_run("long_runs").stdout)["results"]
        assert [row["events"] for row in rows[:2]] == [1_500, 3_000]
        for row in rows[:2]:
            assert min(row["record_s"], row["state_half_first_ms"], row["state_again_ms"]) > 0
            assert min(row["fold_per_s"], row["load_fresh_ms"], row["raw_half_ms"]) > 0
            assert row["first_command_ms"] > 0
            assert row["bytes_per_event"] > 0
            assert row["raw_bytes_per_event"] > 0
        assert rows[2]["state_third_fresh_ratio"] > 0
        assert rows[2]["first_command_ratio"] > 0
        folds = rows[3:]
        named = ["(stream only)", *(cls.__name__ for cls in BUILT_INS)]
        assert [(row["events"], row["full_fold"]) for row in folds] == [
            (size, name) for size in (1_500, 3_000) for name in named
        ]
        assert all(min(row["per_s"], row["cpu_per_s"], row["rss_mb"]) > 0 for row in folds)

    def test_reads_benchmark_reports_both_read_paths(self) -> None:
        """benchmarks.reads --quick times both read paths against raw sqlite3 per case."""
        rows = json.loads(quick_run("reads").stdout)["results"]
        assert [row["case"] for row in rows] == [
            "state (us, median)",
            "history (us, median)",
            "supervised recording (lean read's speed-up; >1 is faster)",
        ]
        for row in rows[:2]:
            assert min(row["raw_sqlite3"], row["eventsourcing_read"], row["lean_read"]) > 0
            assert isinstance(row["met"], bool)
        assert rows[2]["speedup"] > 0


@pytest.mark.slow
@pytest.mark.browser
class TestViewerBenchmark:
    def test_ui_benchmark_reports_every_figure(self) -> None:
        """benchmarks.ui --quick drives Chromium: page, slider, report and concurrency, per size."""
        rows = json.loads(quick_run("ui").stdout)["results"]
        cases = [row["case"] for row in rows]
        assert len(cases) == 9
        for size in range(2):
            page, moves, report, others = rows[4 * size : 4 * size + 4]
            assert page["case"].startswith("run page (")
            assert moves["case"].startswith("slider moves (")
            assert report["case"].startswith("offline report (")
            assert others["case"].startswith("/api/runs while the run page is served")
            assert 0 < page["html_mb"] <= 2
            assert min(moves["jump_median_ms"], moves["step_median_ms"]) > 0
            assert report["embedded_versions"] > 0
            assert all(isinstance(row["met"], bool) for row in (page, moves, report, others))
        assert cases[8] == "machine"

    def test_slider_only_times_the_page_and_moves_with_the_viewer_given(self) -> None:
        """--slider-only gives the page and slider rows only, served by the --viewer script,
        and names no figure it did not take (the projections' in-process time)."""
        script = Path(sys.executable).parent / "stagetrail"
        done = quick_run(
            "ui", "--sizes", "300", "--moves", "3", "--slider-only", "--viewer", str(script)
        )
        rows = json.loads(done.stdout)["results"]
        cases = [row["case"].split(" (")[0] for row in rows]
        assert cases == ["run page", "slider moves", "machine"]
        assert min(rows[1]["jump_median_ms"], rows[1]["step_median_ms"]) > 0
        assert rows[1]["projections_in_process_median_ms"] is None


class TestRetainBenchmark:
    def test_retain_benchmark_reports_drop_time_and_equality(self) -> None:
        """benchmarks.retain --quick measures writers before, during and after compaction on
        each store (SQLite, and PostgreSQL where it answers) and checks a rebuild."""
        done = quick_run("retain")
        rows = json.loads(done.stdout)["results"]
        assert [row["store"] for row in rows] in (["sqlite"], ["sqlite", "postgresql"])
        for row in rows:
            assert row["erased"] == row["runs"] // 10
            assert row["fill_s"] > 0
            assert row["alone_before_runs_per_s"] > 0
            assert row["alone_after_runs_per_s"] > 0
            assert row["compaction_s"] > 0
            assert row["compaction_cpu_s"] > 0
            assert row["projections_equal_rebuild"] is True

    def test_retain_latency_reports_the_slowest_appends(self) -> None:
        """benchmarks.retain --latency --quick erases long runs on PostgreSQL while one
        writer appends, and reports its slowest append alone and during the compaction."""
        require_postgres()
        rows = json.loads(quick_run("retain", "--latency").stdout)["results"]
        assert [row["store"] for row in rows] == ["postgresql"]
        assert rows[0]["events_erased"] == 2 * 2000
        assert rows[0]["slowest_append_alone_ms"] > 0
        assert rows[0]["slowest_append_during_ms"] > 0

    def test_notifier_benchmark_reports_both_notifiers(self) -> None:
        """benchmarks.notifier --quick prints each notifier's CPU per append and their ratio."""
        done = quick_run("notifier")
        (row,) = json.loads(done.stdout)["results"]
        assert row["case"].startswith("notifier CPU per append")
        assert row["loop_alone"] > 0
        assert row["timer_per_interval"] > 0
        assert row["ratio"] == row["ratio"]  # a number: the baseline cost something
