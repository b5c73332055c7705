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
import os
import random
import re
import runpy
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.cli import main
from tests._helpers import transcript_clock

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "recipes.md"
BLOCK = re.compile(r"^```console\n(.*?)^```\n", re.S | re.M)
HEAD = re.compile(r"^(.*?) \| head -n (\d+)$")
EXAMPLE = re.compile(r"^python (examples/\w+\.py)$")


def commands(block: str) -> list[str]:
    """The `$ ` lines of a console block, without the prompt."""
    return [line[2:] for line in block.splitlines() if line.startswith("$ ")]


def run_example(path: str) -> str:
    """What the example's `main()` prints when run with its default store."""
    module = runpy.run_path(str(ROOT / path), run_name=f"recipe_{Path(path).stem}")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        module["main"]()
    return printed.getvalue()


def run(command: str) -> str:
    """What `command` prints (stdout, then stderr), with `| head -n N` handled."""
    limit = None
    piped = HEAD.match(command)
    if piped:
        command, limit = piped.group(1), int(piped.group(2))
    example = EXAMPLE.match(command)
    if example:
        text = run_example(example.group(1))
    else:
        args = shlex.split(command)
        assert args[0] == "stagetrail", command
        result = CliRunner().invoke(main, args[1:])
        assert result.exception is None or isinstance(result.exception, SystemExit), command
        text = result.stdout + result.stderr
    if limit is not None:
        text = "".join(text.splitlines(keepends=True)[:limit])
    return text


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
        text = PAGE.read_text()
        blocks = BLOCK.findall(text)
        generated = [transcript(block, i, monkeypatch) for i, block in enumerate(blocks)]
        if os.environ.get("UPDATE_DOCS") == "1":
            for old, new in zip(blocks, generated, strict=True):
                text = text.replace(f"```console\n{old}```\n", f"```console\n{new}```\n", 1)
            PAGE.write_text(text)
            return
        for old, new in zip(blocks, generated, strict=True):
            assert new == old

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
