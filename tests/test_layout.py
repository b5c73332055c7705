"""The house's rooms: import arrows, no cycles, private modules kept private, the wheel."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "events", "projections")


def module_name(path: Path) -> str:
    """The dotted module name of a source file under ROOT."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports, absolute names (``from a import b`` gives a.b too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


class TestArrows:
    def test_the_import_linter_contracts_hold(self) -> None:
        """lint-imports keeps every contract of pyproject.toml (layers, private modules)."""
        # its own process: lint-imports configures logging (dictConfig), which would
        # disable every logger this test process had made for the tests after it
        code = "from importlinter import cli; raise SystemExit(cli.lint_imports(no_cache=True))"
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def test_no_module_imports_itself_back(self) -> None:
        """No import cycle between any two modules of the installed packages."""
        graph = grimp.build_graph(*PACKAGES, cache_dir=None)
        cycles = []
        for module in sorted(graph.modules):
            for imported in graph.find_modules_directly_imported_by(module):
                back = graph.find_shortest_chain(importer=imported, imported=module)
                if back is not None:
                    cycles.append((module, *back))
        assert cycles == []

    def test_private_modules_are_imported_only_by_their_own_package(self) -> None:
        """A module named _x is imported only from inside the package that holds it."""
        offences = []
        for package in PACKAGES:
            for path in (ROOT / package).rglob("*.py"):
                importer = module_name(path)
                for name in imported_modules(path):
                    parts = name.split(".")
                    private = [i for i, part in enumerate(parts) if part.startswith("_")]
                    if private and parts[0] in PACKAGES:
                        owner = ".".join(parts[: private[0]])
                        if not importer.startswith(owner + ".") and importer != owner:
                            offences.append(f"{importer} imports {name}")
        assert offences == []


OPTIONAL = {
    "langgraph": "engine.integrations.langgraph",
    "langchain_core": "engine.integrations.langgraph",
    "ormsgpack": "engine.integrations.langgraph",
    "opentelemetry": "engine.integrations.otel",
}
"""Each optional extra's top-level import, and the only package allowed to import it."""


class TestOptionalExtras:
    @pytest.mark.parametrize(("extra", "owner"), sorted(OPTIONAL.items()))
    def test_only_its_integration_imports_an_optional_package(self, extra: str, owner: str) -> None:
        """No module outside the integration's own package imports the optional dependency."""
        offences = []
        for package in PACKAGES:
            for path in (ROOT / package).rglob("*.py"):
                importer = module_name(path)
                if importer == owner or importer.startswith(owner + "."):
                    continue
                names = imported_modules(path)
                if any(name == extra or name.startswith(extra + ".") for name in names):
                    offences.append(importer)
        assert offences == []

    def test_the_core_imports_without_the_optional_packages(self) -> None:
        """`import engine` (and the CLI) load no optional integration's dependency."""
        code = (
            "import sys, engine, engine.cli, engine.cli.main, engine.integrations; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('langgraph', 'langchain_core', 'opentelemetry')))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == "[]"


BUILDERS = {"engine/engine.py", "engine/run.py"}
"""The modules that build events: `Run` (every recording call) and `Engine` (a run's start)."""

WRITES = {"append", "write", "serialize"}
"""The store's methods that write (or make what is written)."""


def calls(path: Path) -> list[ast.Call]:
    """Every call in a source file."""
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]


def writes_to_store(call: ast.Call) -> bool:
    """Whether the call is one of `WRITES` on something named like a store."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr in WRITES
        and "store" in ast.unparse(func.value)
    )


class TestOneWayToRecord:
    def test_events_are_built_only_by_run_and_engine(self) -> None:
        """No module but `Run`'s and `Engine`'s calls an event class: every other writer
        (the supervisor, the LangGraph saver) records through `Run`."""
        import events

        kinds = {topic.split(":")[1] for topic in events.EVENT_TYPES}
        offences = []
        for path in (ROOT / "engine").rglob("*.py"):
            where = str(path.relative_to(ROOT))
            if where in BUILDERS:
                continue
            for call in calls(path):
                name = call.func.id if isinstance(call.func, ast.Name) else None
                if isinstance(call.func, ast.Attribute):
                    name = call.func.attr
                if name in kinds:
                    offences.append(f"{where}:{call.lineno} builds {name}")
        assert offences == []

    def test_the_integrations_never_write_to_the_store_themselves(self) -> None:
        """An adapter appends nothing beside `Run`: no store append, write or serialize."""
        offences = []
        for path in (ROOT / "engine" / "integrations").rglob("*.py"):
            for call in calls(path):
                if writes_to_store(call):
                    offences.append(f"{path.name}:{call.lineno} {ast.unparse(call.func)}")
        assert offences == []


class TestWheel:
    def test_only_the_three_packages_are_installed(self) -> None:
        """The wheel holds engine (with its subpackages), events and projections; no examples."""
        config = tomllib.loads((ROOT / "pyproject.toml").read_text())
        include = config["tool"]["setuptools"]["packages"]["find"]["include"]
        packages = set(find_packages(where=str(ROOT), include=include))
        assert {package.split(".")[0] for package in packages} == set(PACKAGES)
        assert {"engine.store", "engine.supervise", "engine.cli", "engine.cli.demo"} <= packages


class TestContributing:
    def test_every_path_contributing_names_exists(self) -> None:
        """Each file or folder CONTRIBUTING.md points a contributor to is really there."""
        text = (ROOT / "CONTRIBUTING.md").read_text()
        paths = {p for p in _code_spans(text) if "/" in p and not p.startswith(("-", "http"))}
        assert paths, "CONTRIBUTING.md names no paths"
        missing = sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists())
        assert missing == []


def _code_spans(text: str) -> set[str]:
    spans = text.split("`")[1::2]
    return {span for span in spans if " " not in span and "<" not in span}
