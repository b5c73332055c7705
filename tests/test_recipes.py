"""docs/recipes.md's transcripts are real output (UPDATE_DOCS=1 rewrites them).

Each ``console`` block of the page is a list of ``$ python examples/<name>.py``
and ``$ stagetrail ...`` commands. The examples run in process (their `main()`
with its default store, ``sqlite:///stagetrail.db`` in a temporary directory)
and the commands through click's runner, all under freezegun with a seeded run
id sequence, so times and ids are the same on every machine.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import runpy
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._helpers import transcript_clock
from tests._transcripts import BLOCK, check_page, commands, first_lines, split_head, stagetrail

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "recipes.md"
EXAMPLE = re.compile(r"^python (examples/\w+\.py)$")


def run_example(path: str) -> str:
    """What the example's `main()` prints when run with its default store."""
    module = runpy.run_path(str(ROOT / path), run_name=f"recipe_{Path(path).stem}")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        module["main"]()
    return printed.getvalue()


def run(command: str) -> str:
    """What `command` prints (stdout, then stderr), with `| head -n N` handled."""
    command, limit = split_head(command)
    example = EXAMPLE.match(command)
    if example:
        text = run_example(example.group(1))
    else:
        result = stagetrail(shlex.split(command), command)
        text = result.stdout + result.stderr
    return first_lines(text, limit)


def transcript(block: str, index: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """The block regenerated: each command followed by what it prints.

    Each block has a run id sequence of its own, so editing one recipe leaves the
    ids the others print as they were.
    """
    seeded = random.Random(f"recipes-{index}")
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=seeded.getrandbits(128), version=4))
    return "".join(f"$ {command}\n{run(command)}" for command in commands(block))


@pytest.fixture
def recipe_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty directory for the default store, under a frozen clock."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STAGETRAIL_STORE", raising=False)
    monkeypatch.delenv("STAGETRAIL_CIPHER_KEY", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    with transcript_clock("2026-11-21 09:00:00"):
        yield tmp_path


class TestTranscript:
    def test_recipes_md_matches_the_examples(
        self, recipe_directory: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every console block of docs/recipes.md is the real output of its commands, in order."""
        check_page(PAGE, lambda index, block: transcript(block, index, monkeypatch))

    def test_every_example_has_a_recipe(self) -> None:
        """Each program in examples/ but review_loop.py is run in a block of docs/recipes.md."""
        shown = {
            match.group(1)
            for block in BLOCK.findall(PAGE.read_text())
            for command in commands(block)
            if (match := EXAMPLE.match(command))
        }
        examples = {f"examples/{path.name}" for path in (ROOT / "examples").glob("*.py")}
        assert shown == examples - {"examples/review_loop.py"}
