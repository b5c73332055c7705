"""Console transcripts in the docs: find their commands, run them, compare or rewrite the page.

docs/cli.md and docs/recipes.md hold ```console blocks of ``$ `` commands and their
output; the tests regenerate every block and compare (``UPDATE_DOCS=1`` rewrites it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner, Result

from engine.cli import main

BLOCK = re.compile(r"^```console\n(.*?)^```\n", re.S | re.M)
HEAD = re.compile(r"^(.*?) \| head -n (\d+)$")


def commands(block: str) -> list[str]:
    """The ``$ `` lines of a console block, without the prompt."""
    return [line[2:] for line in block.splitlines() if line.startswith("$ ")]


def split_head(command: str) -> tuple[str, int | None]:
    """A command without its ``| head -n N``, and N (None when not piped)."""
    piped = HEAD.match(command)
    return (command, None) if piped is None else (piped.group(1), int(piped.group(2)))


def first_lines(text: str, limit: int | None) -> str:
    """The first `limit` lines of `text` (all of it when `limit` is None)."""
    return text if limit is None else "".join(text.splitlines(keepends=True)[:limit])


def stagetrail(args: list[str], command: str) -> Result:
    """`stagetrail ARGS` run in process; a traceback (not an exit) fails the test."""
    assert args[0] == "stagetrail", command
    result = CliRunner().invoke(main, args[1:])
    assert result.exception is None or isinstance(result.exception, SystemExit), command
    return result


def check_page(page: Path, regenerate: Callable[[int, str], str]) -> None:
    """Compare every console block of `page` with `regenerate(index, block)`, or rewrite it."""
    text = page.read_text()
    blocks = BLOCK.findall(text)
    generated = [regenerate(index, block) for index, block in enumerate(blocks)]
    if os.environ.get("UPDATE_DOCS") == "1":
        for old, new in zip(blocks, generated, strict=True):
            text = text.replace(f"```console\n{old}```\n", f"```console\n{new}```\n", 1)
        page.write_text(text)
        return
    for old, new in zip(blocks, generated, strict=True):
        assert new == old
