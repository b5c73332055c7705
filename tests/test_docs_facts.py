"""The docs name only files that exist and counts that are true.

Every repository path, test id and link the pages name (outside their code
blocks, whose output is checked where it is generated) must exist; every count
a page gives for what `stagetrail demo` records must be what a real demo records.
docs/performance-history.md is a log: it names files as they were then.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import attrs
import pytest

from engine import Engine

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "performance-history.md"),
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
TOP = ("engine", "events", "projections", "tests", "docs", "benchmarks", "examples", ".ci")
FILES = ("pyproject.toml", "setup.cfg", "README.md", "CONTRIBUTING.md", ".importlinter")
PATH = re.compile(
    rf"^(?:(?:{'|'.join(re.escape(t) for t in TOP)})/[\w./-]*|{'|'.join(map(re.escape, FILES))})"
    r"(?:::[\w:]+)?$"
)


def prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return FENCE.sub("", page.read_text())


def named_paths(page: Path) -> list[str]:
    """The repository paths (``file::Class::test`` ids too) in the page's inline code."""
    found = []
    for span in CODE.findall(prose(page)):
        token = span.strip().rstrip(".,:;")
        if PATH.match(token) and not re.search(r"[<>*…]", token):
            if "/" in token and "." not in token.rsplit("/", 1)[-1] and not token.endswith("/"):
                continue  # a rate such as events/s, not a path
            found.append(token)
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#+ (.*)$", prose(page), re.M)
    return {slug(heading) for heading in headings}


def missing_in(path: str) -> str | None:
    """What is missing of the path or test id `path`, or None."""
    file, _, names = path.partition("::")
    target = ROOT / file
    if not target.exists():
        return f"{file} does not exist"
    names_given = [name for name in names.split("::") if name]
    text = target.read_text() if names_given else ""
    for name in names_given:
        if not re.search(rf"^\s*(?:class|def|async def) {re.escape(name)}\b", text, re.M):
            return f"{file} has no {name}"
    return None


class TestPaths:
    @pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
    def test_every_path_named_exists(self, page: Path) -> None:
        """Each file, folder and test id a page names in its prose is in the repository."""
        problems = [f"{path}: {why}" for path in named_paths(page) if (why := missing_in(path))]
        assert problems == []

    @pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
    def test_every_link_leads_somewhere(self, page: Path) -> None:
        """Each relative link names a file that exists, and a heading of it when it has #."""
        problems = []
        for target in LINK.findall(prose(page)):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            linked = (page.parent / file).resolve() if file else page
            if not linked.exists():
                problems.append(f"{target}: no file {file}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{target}: no heading #{anchor} in {linked.name}")
        assert problems == []

    def test_the_checks_see_the_paths(self) -> None:
        """The scan finds paths at all: the CONTRIBUTING page names dozens of them."""
        named = named_paths(ROOT / "CONTRIBUTING.md")
        assert "engine/cli/main.py" in named
        assert len(named) > 30


NUMBERS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fourteen": 14,
}  # fmt: skip


def number(word: str) -> int:
    return int(word) if word.isdigit() else NUMBERS[word.lower()]


@attrs.frozen
class Demo:
    """What a real `stagetrail demo` records."""

    runs: int
    children: int
    by_pipeline: Counter[str]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """Record the demo as the command does (the coordinator killed in a child process)."""
    from engine.cli.demo.record import record_all

    url = f"sqlite:///{tmp_path_factory.mktemp('demo') / 'demo.db'}"
    with Engine(url) as engine:
        runs = record_all(engine, url)
        children = sum(len(engine.tree(run.id)) - 1 for run in runs)
    return Demo(len(runs), children, Counter(run.pipeline.name for run in runs))


WORD = r"(\d+|" + "|".join(NUMBERS) + ")"
CLAIMS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"\brecords {WORD} runs", re.I), "runs"),
    (re.compile(rf"\b{WORD} child runs", re.I), "children"),
    (re.compile(rf"\b{WORD} runs of the ([\w-]+) pipeline", re.I), "pipeline"),
    (re.compile(rf"\b{WORD} agent loops", re.I), "agent-loop"),
    (re.compile(rf"\b{WORD} tool-calling conversations", re.I), "tool-calling"),
]


def demo_claims(page: Path) -> list[tuple[str, str, int]]:
    """(the words, what they count, the number) for each count a paragraph on the demo gives."""
    found = []
    for paragraph in prose(page).split("\n\n"):
        if "demo" not in paragraph:
            continue
        text = " ".join(paragraph.split())
        for pattern, kind in CLAIMS:
            for match in pattern.finditer(text):
                what = match.group(2) if kind == "pipeline" else kind
                found.append((match.group(0), what, number(match.group(1))))
    return found


class TestDemoCounts:
    @pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
    def test_every_count_of_the_demo_is_true(self, page: Path, demo: Demo) -> None:
        """ "records 12 runs", "2 child runs", "5 runs of the code-review pipeline": as recorded."""
        actual = {"runs": demo.runs, "children": demo.children, **demo.by_pipeline}
        wrong = [
            f"{words!r}: the demo records {actual.get(what, 0)}"
            for words, what, count in demo_claims(page)
            if actual.get(what, 0) != count
        ]
        assert wrong == []

    def test_the_quick_start_gives_the_counts(self) -> None:
        """The quick start says how many runs the demo records (so the check above has work)."""
        kinds = {what for _, what, _ in demo_claims(ROOT / "docs" / "quickstart.md")}
        assert {"runs", "children", "code-review", "agent-loop", "tool-calling"} <= kinds


def _parametrized(cls: type, name: str) -> list[object]:
    """The values a test of `cls` is parametrised with for argument `name`."""
    for attribute in vars(cls).values():
        for mark in getattr(attribute, "pytestmark", []):
            if mark.name == "parametrize" and mark.args[0] == name:
                return list(mark.args[1])
    raise LookupError(name)


class TestBadInputCounts:
    def test_the_matrix_is_as_large_as_reliability_md_says(self) -> None:
        """The counts of docs/reliability.md's bad-input paragraph are the matrix's."""
        from tests import test_bad_input as matrix

        text = " ".join(prose(ROOT / "docs" / "reliability.md").split())
        paragraph = text.split("`tests/test_bad_input.py` holds the matrix")[1].split(". ")[0]
        said = [int(n) for n in re.findall(r"\d+", paragraph)]
        collected = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/test_bad_input.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        tests = int(re.search(r"(\d+) tests? collected", collected).group(1))  # type: ignore[union-attr]
        assert said == [
            tests,
            len(matrix.LIBRARY_CASES),
            len(matrix.CLI_CASES),
            len(matrix.IMPORT_CASES),
            len([n for n in dir(matrix.TestImportOfAStoredRun) if n.startswith("test_")]),
            len(matrix.SQLITE_FILES),
            len(_parametrized(matrix.TestSQLiteFiles, "command")),
            len(matrix.EVERY_COMMAND),
        ]
