"""The viewer's speed and size in a real browser, on runs of 10,000, 200,000 and 1,000,000 events.

Run: ``python -m benchmarks.ui`` (``--quick`` for a smoke run on small runs,
``--json`` for machine output, ``--sizes 10000,200000`` to choose the sizes,
``--keep DIR`` to keep the recorded stores in DIR and reuse them next time,
``--moves N`` slider moves of each kind, ``--viewer SCRIPT`` to serve with another
checkout's ``stagetrail`` (old and new code alternated on the same stores),
``--slider-only`` for 1. and 2. alone, without the baseline).
Needs the ``ui`` extra and Debian's chromium at /usr/bin/chromium.

For each size, against the targets of docs/ui.md:

1. the run page: the size of its HTML (target: at most 2 MB), the server's
   answer alone (fetched without a browser), and in headless Chromium its first
   contentful paint (target: under 1 s) and its first state drawn
   (``body[data-ready]``), as the page's own ``performance`` says;
2. slider moves to versions never asked before, random jumps across the whole
   run (each far one also fetches the timeline's window) and steps to the next
   version (target: under 100 ms at the 95th percentile); beside them, the
   baseline: ``engine.project(run_id, RunView, at=N)``, what a state answer is
   made of, timed in this process;
3. the offline report: time to write it, its size (target: at most 5 MB) and its
   load in Chromium (target: under 3 s);
4. other requests while a page is served: ``/api/runs`` timed while a thread
   fetches the run page of the run again and again (target: under 200 ms).

The machine's load average is printed with the figures: shared machines skew them.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from uuid import UUID

from freezegun import freeze_time

from benchmarks._common import report
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

SIZES = (10_000, 200_000, 1_000_000)
QUICK_SIZES = (1_000, 3_000)

MOVE = """async (version) => {
  const slider = document.getElementById("slider");
  const start = performance.now();
  slider.value = String(version);
  slider.dispatchEvent(new Event("input"));
  while (document.body.dataset.shownVersion !== String(version)) {
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  return performance.now() - start;
}"""
"""Move the slider in the page and time it until the page has drawn that version and the
browser has laid it out and painted it (the frame after the drawing)."""

READY = "() => performance.now()"
PAINT = """() => {
  const paint = performance.getEntriesByName("first-contentful-paint")[0];
  return paint ? paint.startTime : null;
}"""

WAIT_MS = 900_000
"""How long a page may take to draw its first state (a first fold of a huge run is slow)."""

CYCLES_PER_BATCH = 100
"""Loops recorded per transaction: a million events are written in minutes, not hours."""


def options() -> argparse.Namespace:
    """--quick, --json, --sizes, --keep, --moves, --viewer, --slider-only."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small runs, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--sizes", help="comma-separated run sizes in events")
    parser.add_argument("--keep", help="a directory to keep (and reuse) the recorded stores in")
    parser.add_argument("--moves", type=int, help="slider moves of each kind (default 30)")
    parser.add_argument(
        "--viewer",
        help="the `stagetrail` script to serve with (default: this one's), to alternate code",
    )
    parser.add_argument(
        "--slider-only",
        action="store_true",
        help="time only the page and the slider's moves (no baseline, report or /api/runs)",
    )
    return parser.parse_args()


def write_run(url: str, events: int) -> UUID:
    """A code review whose developer/testing loop runs until the run has about `events` events."""
    with Engine(url) as engine, freeze_time("2026-11-20 09:00:00", auto_tick_seconds=3):
        run = engine.start_run(REVIEW, labels={"bench": "ui"})
        with run.batch():
            run.stage_completed("project_analysis", {"project_type": "python"}, duration=5.0)
            run.stage_completed("code_review", {"critical": 3}, duration=20.0)
        cycle = 0
        while run.version < events - 15 * CYCLES_PER_BATCH:
            with run.batch():
                for _ in range(CYCLES_PER_BATCH):
                    _cycle(run, cycle)
                    cycle += 1
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


def recorded(size: int, keep: str | None) -> tuple[str, UUID]:
    """The store and run of `size` events: kept from an earlier run of the benchmark, or new."""
    if keep is None:
        url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='stagetrail-bench-')) / 'ui.db'}"
        return url, write_run(url, size)
    path = Path(keep) / f"ui-{size}.db"
    url = f"sqlite:///{path}"
    if path.exists():
        with Engine(url, create=False) as engine:
            return url, engine.runs(label="bench=ui", limit=1)[0].run_id
    path.parent.mkdir(parents=True, exist_ok=True)
    return url, write_run(url, size)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(url: str, viewer: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """`stagetrail ui` over `url` on a free port, once it answers (`viewer`: the script)."""
    port = free_port()
    script = Path(viewer) if viewer else Path(sys.executable).parent / "stagetrail"
    command = [str(script), "ui", "--store", url, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(base + "/api/runs", timeout=60).close()
            return process, base
        except OSError:
            time.sleep(0.1)
    process.terminate()
    raise RuntimeError("stagetrail ui did not answer")


def fetch(address: str) -> tuple[float, int]:
    """Milliseconds for the server's answer to GET `address` (no browser), and its bytes."""
    start = time.perf_counter()
    with urllib.request.urlopen(address, timeout=120) as answer:
        size = len(answer.read())
    return (time.perf_counter() - start) * 1000, size


def load(page: Any, address: str) -> tuple[float, float]:
    """Milliseconds to the first contentful paint and to the first state drawn."""
    page.goto(address)
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=WAIT_MS)
    return float(page.evaluate(PAINT) or 0.0), float(page.evaluate(READY))


def move_times(page: Any, versions: list[int]) -> list[float]:
    """Milliseconds of each slider move to `versions`, in order."""
    return [float(page.evaluate(MOVE, version)) for version in versions]


def projection_ms(url: str, run_id: UUID, versions: list[int], last: int) -> list[float]:
    """Milliseconds of a state answer's projections for each version, in this process."""
    with Engine(url, create=False) as engine:
        times = []
        for version in versions:
            start = time.perf_counter()
            snapshot.at_version(engine, run_id, version, last)
            times.append((time.perf_counter() - start) * 1000)
    return times


def while_served(base: str, address: str, samples: int) -> list[float]:
    """Milliseconds of `/api/runs` while a thread fetches `address` again and again."""
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            fetch(address)

    threads = [threading.Thread(target=hammer, daemon=True)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    times = []
    for _ in range(samples):
        times.append(fetch(base + "/api/runs")[0])
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    return times


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def measure(
    size: int, keep: str | None, moves: int, browser: Any, chosen: argparse.Namespace
) -> list[dict[str, object]]:
    """Every figure of the run of `size` events (the page and the slider's, if `slider_only`)."""
    started = time.perf_counter()
    url, run_id = recorded(size, keep)
    record_s = time.perf_counter() - started
    with Engine(url, create=False) as engine:
        last = engine.store.last(run_id).version  # type: ignore[union-attr]
    picks = random.Random(7).sample(range(1, last + 1), moves)
    process, base = serve(url, chosen.viewer)
    try:
        address = f"{base}/runs/{run_id}"
        server_ms, html_bytes = fetch(address)
        page = browser.new_page()
        cold = load(page, address)
        warm = [load(page, address) for _ in range(2)]
        moved = move_times(page, picks)
        start = last // 3
        stepped = move_times(page, list(range(start, start + moves)))
        if chosen.slider_only:
            page.close()
            return [
                _page_row(last, record_s, html_bytes, server_ms, cold, warm),
                _move_row(last, moved, stepped, None),
            ]
        baseline = projection_ms(url, run_id, picks[:10], last)
        others = while_served(base, address, 20)
        rows = [
            _page_row(last, record_s, html_bytes, server_ms, cold, warm),
            _move_row(last, moved, stepped, baseline),
            _report_row(last, url, run_id, page),
            _others_row(last, others),
        ]
        page.close()
        return rows
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    """Record (or reuse) the runs, serve each, drive Chromium, print the figures."""
    chosen = options()
    sizes: tuple[int, ...] = QUICK_SIZES if chosen.quick else SIZES
    if chosen.sizes:
        sizes = tuple(int(size) for size in chosen.sizes.split(","))
    moves = chosen.moves or (10 if chosen.quick else 30)
    load_average = os.getloadavg()
    rows: list[dict[str, object]] = []
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=ARGS, headless=True
        )
        for size in sizes:
            rows += measure(size, chosen.keep, moves, browser, chosen)
        browser.close()
    rows.append(
        {
            "case": "machine",
            "loadavg_1m_5m_15m_at_start": " ".join(f"{x:.2f}" for x in load_average),
            "loadavg_at_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        }
    )
    report("stagetrail ui: run pages, slider and report by run size", rows, chosen.json)


def _page_row(
    events: int,
    record_s: float,
    html_bytes: int,
    server_ms: float,
    cold: tuple[float, float],
    warm: list[tuple[float, float]],
) -> dict[str, object]:
    paints = [cold[0], *(paint for paint, _ in warm)]
    return {
        "case": f"run page ({events} events)",
        "store_ready_s": record_s,
        "html_mb": html_bytes / 1e6,
        "server_ms": server_ms,
        "first_paint_cold_ms": cold[0],
        "first_paint_max_ms": max(paints),
        "ready_cold_ms": cold[1],
        "met": html_bytes <= 2e6 and max(paints) < 1000,
    }


def _move_row(
    events: int, moved: list[float], stepped: list[float], baseline: list[float] | None
) -> dict[str, object]:
    # None (`--slider-only`): the projections were not timed, and no figure says they were.
    return {
        "case": f"slider moves ({events} events)",
        "jump_median_ms": statistics.median(moved),
        "jump_p95_ms": p95(moved),
        "step_median_ms": statistics.median(stepped),
        "step_p95_ms": p95(stepped),
        "projections_in_process_median_ms": None
        if baseline is None
        else statistics.median(baseline),
        "met": max(p95(moved), p95(stepped)) < 100,
    }


def _report_row(events: int, url: str, run_id: UUID, page: Any) -> dict[str, object]:
    path = Path(tempfile.mkdtemp(prefix="stagetrail-bench-")) / "report.html"
    with Engine(url, create=False) as engine:
        start = time.perf_counter()
        written = write_report(engine, run_id, path)
        seconds = time.perf_counter() - start
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=WAIT_MS)
    ready = float(page.evaluate(READY))
    size = path.stat().st_size
    return {
        "case": f"offline report ({events} events)",
        "write_s": seconds,
        "size_mb": size / 1e6,
        "embedded_versions": written.embedded,
        "load_ms": ready,
        "met": size <= 5e6 and ready < 3000,
    }


def _others_row(events: int, others: list[float]) -> dict[str, object]:
    return {
        "case": f"/api/runs while the run page is served ({events} events)",
        "median_ms": statistics.median(others),
        "max_ms": max(others),
        "met": max(others) < 200,
    }


if __name__ == "__main__":
    main()
