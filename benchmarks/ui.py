"""The viewer's speed in a real browser: the run page of a 10,000-event run, and the slider.

Run: ``python -m benchmarks.ui`` (``--quick`` for a smoke run, ``--json`` for
machine output). Needs the ``ui`` extra and Debian's chromium at /usr/bin/chromium.

1. load to interactive: from navigation start to the page having drawn its first
   state (``body[data-ready]``), in headless Chromium, as the page's own
   ``performance.now()`` says (target: under 2 s); beside it, the baseline of
   the same process: the server's answer alone (the HTML, fetched without a browser);
2. slider move: from the ``input`` event to the new state drawn, for versions
   never asked before, over the JSON API (target: under 100 ms): random jumps
   across the run, and steps from one version to the next; beside it, the
   same versions again (the page's cache: drawing alone), the API's answer
   fetched without a browser, and the baseline: ``engine.project(run_id,
   RunView, at=N)``, what the answer is made of, timed in this process;
3. the offline report of the same run: time to write it, its size, and its
   slider moves (no server: the states are embedded).

The machine's load average is printed with the figures: shared machines skew them.
"""

from __future__ import annotations

import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from uuid import UUID

from freezegun import freeze_time

from benchmarks._common import arguments, report, scratch
from engine import Engine
from engine.cli.demo.code_review import REVIEW, BuildException
from engine.ui import snapshot, write_report
from events import RetryScheduled

CHROMIUM = "/usr/bin/chromium"
"""Debian's Chromium: Playwright never downloads a browser here."""
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

MOVE = """async (version) => {
  const slider = document.getElementById("slider");
  const start = performance.now();
  slider.value = String(version);
  slider.dispatchEvent(new Event("input"));
  while (document.body.dataset.shownVersion !== String(version)) {
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
  return performance.now() - start;
}"""
"""Move the slider in the page and time it until the page has drawn that version."""

READY = "() => performance.now()"


def write_run(url: str, events: int) -> UUID:
    """A code review whose developer/testing loop runs until the run has about `events` events."""
    with Engine(url) as engine, freeze_time("2026-11-20 09:00:00", auto_tick_seconds=3):
        run = engine.start_run(REVIEW, labels={"bench": "ui"})
        with run.batch():
            run.stage_completed("project_analysis", {"project_type": "python"}, duration=5.0)
            run.stage_completed("code_review", {"critical": 3}, duration=20.0)
        cycle = 0
        while run.version < events - 10:
            with run.batch():
                _cycle(run, cycle)
            cycle += 1
        run.finish("succeeded")
        return run.id


def _cycle(run: Any, cycle: int) -> None:
    """One loop: a failed build and its retry, a build, a failed test (every 10th: redone)."""
    run.stage_started("developer")
    run.stage_failed("developer", BuildException(f"compile error #{cycle}"), duration=40.0)
    attempt = run.machine.open_attempt or 0
    run.record(RetryScheduled, stage="developer", attempt=attempt + 1, delay=2.0, reason="build")
    run.stage_started("developer")
    run.stage_completed("developer", {"changed_files": cycle % 7}, duration=55.0)
    run.stage_started("testing")
    run.stage_failed("testing", f"test_{cycle} failed", error_type="TestFailure", duration=12.0)
    if cycle % 10 == 9:  # the failure was a flaky test: undone, and the test run again
        run.rollback(1, reason="flaky test")
        run.stage_started("testing")
        run.stage_failed("testing", f"test_{cycle} failed", error_type="TestFailure", duration=12.0)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(url: str) -> tuple[subprocess.Popen[bytes], str]:
    """`stagetrail ui` over `url` on a free port, once it answers."""
    port = free_port()
    script = Path(sys.executable).parent / "stagetrail"
    command = [str(script), "ui", "--store", url, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/api/runs", timeout=5).close()
            return process, base
        except OSError:
            time.sleep(0.1)
    process.terminate()
    raise RuntimeError("stagetrail ui did not answer")


def load_times(page: Any, address: str, repeats: int) -> list[float]:
    """Milliseconds from navigation start to the first state drawn, `repeats` times."""
    times = []
    for _ in range(repeats):
        page.goto(address)
        page.wait_for_selector("body[data-ready='1']", state="attached")
        times.append(page.evaluate(READY))
    return times


def move_times(page: Any, versions: list[int]) -> list[float]:
    """Milliseconds of each slider move to `versions`, in order."""
    return [float(page.evaluate(MOVE, version)) for version in versions]


def fetch_seconds(address: str) -> float:
    """Seconds for the server's answer to GET `address` (no browser)."""
    start = time.perf_counter()
    with urllib.request.urlopen(address, timeout=60) as answer:
        answer.read()
    return time.perf_counter() - start


def projection_ms(url: str, run_id: UUID, versions: list[int]) -> list[float]:
    """Milliseconds of the five projections behind each answer, in this process."""
    with Engine(url, create=False) as engine:
        last = len(engine.events(run_id))
        times = []
        for version in versions:
            start = time.perf_counter()
            snapshot.at_version(engine, run_id, version, last)
            times.append((time.perf_counter() - start) * 1000)
    return times


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def main() -> None:
    """Build the run, serve it, drive Chromium, print the figures."""
    options = arguments(__doc__ or "")
    size, repeats, moves = (1_000, 2, 10) if options.quick else (10_000, 5, 50)
    load = os.getloadavg()
    url = f"sqlite:///{scratch('ui.db')}"
    run_id = write_run(url, size)
    with Engine(url, create=False) as engine:
        events = len(engine.events(run_id))
    picks = random.Random(7).sample(range(1, events + 1), moves)
    baseline = projection_ms(url, run_id, picks)
    process, base = serve(url)
    rows: list[dict[str, object]] = []
    try:
        from playwright.sync_api import sync_playwright

        with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
            browser = playwright.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, args=ARGS, headless=True
            )
            page = browser.new_page()
            address = f"{base}/runs/{run_id}"
            server = [fetch_seconds(address) * 1000 for _ in range(repeats)]
            loads = load_times(page, address, repeats)
            moved = move_times(page, picks)
            api = [fetch_seconds(f"{base}/api/runs/{run_id}/state?at={v}") * 1000 for v in picks]
            drawn = move_times(page, picks)  # the same versions again: answered from the cache
            start = events // 3
            stepped = move_times(page, list(range(start, start + moves)))  # ▶ held down
            rows.append(_load_row(events, loads, server))
            rows.append(_move_row(moved, baseline, api))
            rows.append(_drawn_row(drawn))
            rows.append(_stepped_row(stepped))
            rows.append(_report_row(url, run_id, page, picks[:moves]))
            browser.close()
    finally:
        process.terminate()
        process.wait(timeout=10)
    rows.append({"case": "machine", "loadavg_1m_5m_15m": " ".join(f"{x:.2f}" for x in load)})
    report(f"stagetrail ui: run page of a {events}-event run", rows, options.json)


def _load_row(events: int, loads: list[float], server: list[float]) -> dict[str, object]:
    return {
        "case": f"run page load to interactive ({events} events)",
        "first_ms": loads[0],
        "median_ms": statistics.median(loads),
        "server_html_ms": statistics.median(server),
        "target_ms": 2000.0,
        "met": max(loads) < 2000,
    }


def _move_row(moved: list[float], baseline: list[float], api: list[float]) -> dict[str, object]:
    return {
        "case": f"slider move, uncached version ({len(moved)} moves)",
        "median_ms": statistics.median(moved),
        "p95_ms": p95(moved),
        "max_ms": max(moved),
        "api_answer_median_ms": statistics.median(api),
        "projections_in_process_median_ms": statistics.median(baseline),
        "target_ms": 100.0,
        "met": p95(moved) < 100,
    }


def _stepped_row(stepped: list[float]) -> dict[str, object]:
    return {
        "case": f"slider step to the next version, uncached ({len(stepped)} steps)",
        "median_ms": statistics.median(stepped),
        "p95_ms": p95(stepped),
        "target_ms": 100.0,
        "met": p95(stepped) < 100,
    }


def _drawn_row(drawn: list[float]) -> dict[str, object]:
    return {
        "case": "slider move, version seen before (drawing only)",
        "median_ms": statistics.median(drawn),
        "p95_ms": p95(drawn),
    }


def _report_row(url: str, run_id: UUID, page: Any, versions: list[int]) -> dict[str, object]:
    path = Path(tempfile.mkdtemp(prefix="stagetrail-bench-")) / "report.html"
    with Engine(url, create=False) as engine:
        start = time.perf_counter()
        written = write_report(engine, run_id, path)
        seconds = time.perf_counter() - start
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", state="attached")
    ready = float(page.evaluate(READY))
    moved = move_times(page, versions)
    return {
        "case": "offline report of the same run",
        "write_s": seconds,
        "size_mb": path.stat().st_size / 1e6,
        "embedded_versions": written.embedded,
        "load_ms": ready,
        "move_median_ms": statistics.median(moved),
        "move_p95_ms": p95(moved),
    }


if __name__ == "__main__":
    main()
