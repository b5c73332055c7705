"""A run as a trace in Arize Phoenix, an OpenTelemetry trace viewer installed from PyPI, in a
real browser (the screenshot docs/otel.md shows is taken here; UPDATE_DOCS=1 retakes it).

Phoenix is not one of the project's extras: it brings ~850 MB of dependencies whose pins
need not agree with stagetrail's, so it lives in a virtual environment of its own, e.g.
``python3 -m venv /opt/phoenix && /opt/phoenix/bin/pip install arize-phoenix``, and the
test finds its ``phoenix`` command through ``$STAGETRAIL_PHOENIX`` or the PATH. Without
it the test skips, naming that line; ``STAGETRAIL_REQUIRE_PHOENIX=1`` makes that a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="needs the otel extra")
pytest.importorskip("playwright", reason="needs the ui extra")

from engine import Engine
from engine.integrations.otel import export_runs, otlp_exporter
from tests.integrations.test_otel import recorded
from tests.ui import conftest as ui

browser = ui.browser
"""The viewer tests' headless Chromium, as a fixture of this module too."""

ROOT = Path(__file__).resolve().parents[2]
SHOT = ROOT / "docs" / "otel-run.png"
PNG = b"\x89PNG\r\n\x1a\n"
INSTALL = "python3 -m venv /opt/phoenix && /opt/phoenix/bin/pip install arize-phoenix"


def phoenix_command() -> str:
    """The ``phoenix`` command to start, else a skip (a failure under
    STAGETRAIL_REQUIRE_PHOENIX=1) that says how to install it."""
    found = os.environ.get("STAGETRAIL_PHOENIX") or shutil.which("phoenix")
    if found and Path(found).exists():
        return found
    why = (
        "Arize Phoenix is not installed (set STAGETRAIL_PHOENIX to its phoenix command, "
        f"or put it on the PATH): {INSTALL}"
    )
    if os.environ.get("STAGETRAIL_REQUIRE_PHOENIX") == "1":
        pytest.fail(f"STAGETRAIL_REQUIRE_PHOENIX=1 but {why}")
    pytest.skip(why)


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answer(url: str) -> Any:
    """The JSON `url` answers with."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Phoenix server on free ports with an empty working directory; its base URL."""
    command = phoenix_command()
    port = free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(tmp_path_factory.mktemp("phoenix")),
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_HOST": "127.0.0.1",
    }
    server = subprocess.Popen(  # the command is the viewer's, found above
        [command, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(server, base)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def wait_for(server: subprocess.Popen[bytes], base: str) -> None:
    """Return once Phoenix lists its projects (its start-up migrates a new database)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            _, err = server.communicate()
            pytest.fail(f"phoenix serve exited with {server.returncode}: {err!r}")
        try:
            answer(f"{base}/v1/projects")
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    pytest.fail(f"Phoenix did not answer at {base}")


@pytest.mark.slow  # Phoenix takes 30 s to 2 min to start
@pytest.mark.browser
class TestPhoenix:
    def test_a_run_is_a_trace_of_its_attempts(
        self, phoenix: str, request: pytest.FixtureRequest
    ) -> None:
        """Exported over OTLP/HTTP, a run shows in Phoenix as one trace: its span, each
        attempt and its child run's under it, its verdict and labels on the run's span."""
        engine = Engine("memory://")
        run_id, _ = recorded(engine)
        exported = export_runs(engine, [run_id], otlp_exporter(phoenix))
        assert exported.spans > 0
        (project,) = answer(f"{phoenix}/v1/projects")["data"]
        page = request.getfixturevalue("browser").new_page()
        page.set_viewport_size({"width": 1400, "height": 900})
        shown = trace_page(page, f"{phoenix}/projects/{project['id']}/traces/{run_id.hex}")
        for name in ("run code-review", "developer #1", "developer #2", "project_analysis #1"):
            assert name in shown
        assert "no progress" in shown  # the verdict's reason, the run span's status
        assert "C-42" in shown  # a label, an attribute of the run's span
        if os.environ.get("UPDATE_DOCS") == "1":
            page.screenshot(path=str(SHOT))
        page.close()
        pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (ROOT / "docs" / "otel.md").read_text())
        assert pictures == [SHOT.name]
        assert SHOT.read_bytes().startswith(PNG)


SHOWN = "['developer #1', 'C-42'].every(t => document.body.innerText.includes(t))"
"""Whether the trace's spans and the run span's attributes are on the page."""


def trace_page(page: Any, url: str) -> str:
    """The text of the trace's page once its spans have arrived (Phoenix ingests them
    asynchronously: the page is loaded again until they show)."""
    deadline = time.monotonic() + 60
    while True:
        page.goto(url)
        try:
            page.wait_for_function(SHOWN, timeout=15_000)
            return str(page.inner_text("body"))
        except Exception:  # Playwright's TimeoutError: not there yet
            if time.monotonic() > deadline:
                raise
