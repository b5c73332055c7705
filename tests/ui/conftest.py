"""A real headless Chromium per module, and `stagetrail ui` served on a free loopback port.

Chromium is Debian's (/usr/bin/chromium, installed by .ci/run): Playwright only
drives it, it never downloads a browser of its own.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import benchmarks.ui
from tests._helpers import require_browser

# The benchmark and the tests launch Chromium the same way: one list of flags.
CHROMIUM = Path(benchmarks.ui.CHROMIUM)
CHROMIUM_ARGS = benchmarks.ui.ARGS
ARTIFACTS = Path(__file__).parent / "artifacts"
"""Screenshots the browser tests take (git-ignored), for a person to look at."""

STARTUP_ATTEMPTS = 150
"""Tries (0.1 s apart) for a started viewer to answer before the test fails."""


def free_port() -> int:
    """A TCP port nothing listens on at this moment, on the loopback address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stagetrail_command(*args: str) -> list[str]:
    """The installed `stagetrail` console script (as a user runs it) with `args`."""
    script = Path(sys.executable).with_name("stagetrail")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "from engine.cli import main; main()", *args]


@attrs.frozen
class Served:
    """A running `stagetrail ui` and where it answers."""

    process: subprocess.Popen[str]
    base: str

    def get(self, path: str) -> Any:
        """The JSON answer to GET `path`."""
        with urllib.request.urlopen(self.base + path, timeout=30) as answer:
            return json.load(answer)

    def status(self, path: str) -> tuple[int, Any]:
        """The status and JSON body of GET `path`, errors included."""
        try:
            with urllib.request.urlopen(self.base + path, timeout=30) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)


@pytest.fixture(scope="module")
def serve() -> Iterator[Any]:
    """Start `stagetrail ui --store URL` (as many as asked); all are stopped after the module."""
    started: list[subprocess.Popen[str]] = []

    def start(url: str) -> Served:
        port = free_port()
        command = stagetrail_command("ui", "--store", url, "--port", str(port))
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started.append(process)
        served = Served(process, f"http://127.0.0.1:{port}")
        _wait_until_answering(served)
        return served

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_answering(served: Served) -> None:
    for _ in range(STARTUP_ATTEMPTS):
        if served.process.poll() is not None:
            _, err = served.process.communicate()
            pytest.fail(f"stagetrail ui exited with {served.process.returncode}: {err}")
        try:
            served.get("/api/runs")
            return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    pytest.fail(f"stagetrail ui did not answer at {served.base}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium (Debian's) for the module, with an empty profile."""
    require_browser(CHROMIUM)
    import tempfile

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh tab that fails the test on any script error."""
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    tab.close()
    assert not errors, errors


def screenshot(page: Any, name: str) -> Path:
    """Save the whole page as tests/ui/artifacts/NAME.png (a test artifact)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
