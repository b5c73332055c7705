"""The documentation's examples run, its diagram is generated, its commands are CI's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli.demo.code_review import REVIEW

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


class TestExamples:
    @pytest.mark.parametrize("path", [p for p in DOCS if blocks(p, "python")], ids=lambda p: p.name)
    def test_python_examples_run(
        self, path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every python block of the page runs, in order, in one namespace."""
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("STAGETRAIL_STORE", raising=False)
        namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
        for index, source in enumerate(blocks(path, "python")):
            code = compile(source, f"{path.name}[block {index}]", "exec")
            exec(code, namespace)

    def test_the_diagram_in_concepts_is_generated_from_the_table(self) -> None:
        """The Mermaid block in concepts.md is REVIEW.to_mermaid() (UPDATE_DOCS=1 rewrites it)."""
        path = ROOT / "docs" / "concepts.md"
        (diagram,) = blocks(path, "mermaid")
        generated = REVIEW.to_mermaid().rstrip("\n") + "\n"
        if os.environ.get("UPDATE_DOCS") == "1":
            path.write_text(path.read_text().replace(diagram, generated))
            return
        assert diagram == generated


class TestQuickStart:
    def test_readme_has_exactly_two_quick_start_commands(self) -> None:
        """The quick start is one command for the demo and one for the tests."""
        section = (ROOT / "README.md").read_text().split("## Quick start")[1].split("\n## ")[0]
        commands = [body.strip() for lang, body in FENCE.findall(section) if lang == "bash"]
        assert len(commands) == 2
        assert commands[0].endswith("stagetrail demo")
        assert "pytest" in commands[1]

    def test_ci_runs_the_readme_test_command(self) -> None:
        """.ci/run runs the README's test command, with the $PYTHON it honours as python3."""
        section = (ROOT / "README.md").read_text().split("## Quick start")[1]
        test_command = [b.strip() for lang, b in FENCE.findall(section) if lang == "bash"][1]
        assert test_command.startswith("python3 ")
        ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
        assert '"$PYTHON"' + test_command.removeprefix("python3") in ci_lines
        assert "PYTHON=${PYTHON:-python3}" in ci_lines

    def test_ci_installs_the_project_once(self) -> None:
        """.ci/run installs the project a single time: the linters use the tests' install."""
        script = (ROOT / ".ci" / "run").read_text()
        assert script.count("pip install") == 1


class TestTheTestCommandOnWorkers:
    def test_a_worker_fails_a_required_but_unreachable_postgres(self) -> None:
        """The test command runs on xdist workers, and STAGETRAIL_REQUIRE_POSTGRES=1 reaches
        them: an unreachable server fails a PostgreSQL fixture there instead of skipping."""
        unreachable = "postgresql://postgres@127.0.0.1:1/test"  # nothing listens on port 1
        env = {
            **os.environ,
            "STAGETRAIL_REQUIRE_POSTGRES": "1",
            "STAGETRAIL_TEST_POSTGRES": unreachable,
        }
        test = "tests/store/postgres/test_open.py::TestBigAppends"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "-q", test],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "[gw" in done.stdout  # the failures come from workers
        assert "2 errors" in done.stdout  # the fixture fails: no skip
        assert "STAGETRAIL_REQUIRE_POSTGRES=1 but no PostgreSQL reachable" in done.stdout
