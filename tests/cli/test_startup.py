"""What each command loads: start-up stays cheap because a command imports only what it uses.

Speed itself is measured in benchmarks/cli.py (figures in docs/performance.md);
here, which modules a fresh process has loaded when a command is done, which
does not depend on how busy the machine is.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from engine import Engine
from engine.version import VERSION
from tests._helpers import REVIEW

ROOT = Path(__file__).resolve().parents[2]

_LOADED = (
    "import json, sys\n"
    "from engine.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit:\n"
    "    pass\n"
    "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
)


def loaded(*args: str) -> set[str]:
    """The modules a fresh process has imported once `stagetrail ARGS` is done."""
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *args], capture_output=True, text=True, check=True
    )
    return set(json.loads(done.stderr.splitlines()[-1]))


def packages(modules: set[str]) -> set[str]:
    """The top-level packages, and stagetrail's subpackages, among `modules`."""
    return {".".join(name.split(".")[:2]) if name.startswith("engine.") else name.split(".")[0]
            for name in modules}  # fmt: skip


class TestWhatACommandLoads:
    @pytest.mark.parametrize("flag", ["--version", "--help"])
    def test_version_and_help_load_no_engine(self, flag: str) -> None:
        """--version and --help load click and the command table, nothing of the engine."""
        found = packages(loaded(flag))
        unwanted = {
            "engine.engine", "engine.store", "engine.supervise", "engine.readside",
            "engine.ui", "events", "projections", "eventsourcing", "transitions", "rich",
            "attrs", "attr", "importlib_metadata", "sqlite3", "psycopg", "starlette", "orjson",
            "uvicorn", "immutables", "email",
        }  # fmt: skip
        assert found & unwanted == set()
        assert "importlib.metadata" not in loaded(flag)

    def test_runs_loads_no_supervisor_diagrams_or_viewer(self, tmp_path: Path) -> None:
        """`runs` reads the index: not the supervisor, transitions, rich (in a pipe) or the ui."""
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        with Engine(url) as engine:
            engine.start_run(REVIEW)
        found = packages(loaded("runs", "--limit", "50", "--store", url))
        assert "engine.store" in found  # it did open the store
        unwanted = {"engine.supervise", "engine.ui", "transitions", "rich", "psycopg", "graphviz"}
        assert found & unwanted == set()
        folds = {name for name in loaded("runs", "--store", url) if name.startswith("projections.")}
        assert not folds & {"projections.stack", "projections.results", "projections.rounds"}

    def test_runs_loads_no_write_side_verification_or_retention(self, tmp_path: Path) -> None:
        """`runs` reads the index: not the run handle and its machine, the snapshot keeper,
        verification, retention, other backends, the shard layout's TOML or a thread pool."""
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        with Engine(url) as engine:
            engine.start_run(REVIEW)
        found = loaded("runs", "--limit", "50", "--json", "--store", url)
        assert "engine.store.sqlite" in found  # it did open the store
        unwanted = {
            "engine.run", "engine.machine", "engine.commit", "engine.readside.keeper",
            "engine.verify", "engine.retention", "engine.store.memory", "engine.store.module",
            "tomllib", "concurrent.futures",
        }  # fmt: skip
        assert found & unwanted == set()

    @pytest.mark.parametrize("command", ["show", "state", "replay"])
    def test_reading_a_run_loads_no_metadata_viewer_or_drivers_it_does_not_use(
        self, tmp_path: Path, command: str
    ) -> None:
        """show/state/replay of a SQLite run: no importlib.metadata (value readers are looked
        up only for values that need one), no viewer, web server, PostgreSQL or rich in a pipe."""
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        with Engine(url) as engine:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis", {"project_type": "go"})
        modules = loaded(command, str(run.id), "--store", url)
        found = packages(modules)
        assert "engine.store" in found  # it did read the run
        unwanted = {
            "engine.supervise", "engine.ui", "engine.integrations", "transitions", "rich",
            "psycopg", "starlette", "uvicorn", "graphviz", "langgraph", "opentelemetry",
            "importlib_metadata", "email",
        }  # fmt: skip
        assert found & unwanted == set()
        assert "importlib.metadata" not in modules


class TestVersion:
    def test_the_constant_is_the_distributions_version(self) -> None:
        """`stagetrail --version` prints pyproject.toml's version, as installed."""
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        assert VERSION == project["version"] == importlib.metadata.version("stagetrail")

    def test_the_command_prints_it(self) -> None:
        """--version prints the program's name and VERSION."""
        from tests.cli._helpers import ok

        assert ok("--version") == f"stagetrail, version {VERSION}\n"
