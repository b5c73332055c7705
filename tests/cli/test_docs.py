"""docs/cli.md's transcript is what the commands print on a demo store (UPDATE_DOCS=1 rewrites it).

The demo is recorded under freezegun with a seeded run id sequence (and its
coordinator in process), so times and ids are the same on every machine; each
``console`` block of the page is a list of ``$ stagetrail ...`` commands whose
outputs the test regenerates and compares.
"""

from __future__ import annotations

import contextlib
import random
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine, Run
from engine.cli import main
from engine.cli.demo import coordinator
from tests._helpers import transcript_clock
from tests._transcripts import BLOCK, check_page, commands, first_lines, split_head, stagetrail

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"


def run(command: str, cwd: Path) -> str:
    """What `command` prints (stdout, then stderr), with `> file` and `| head -n N` handled."""
    command, limit = split_head(command)
    args = shlex.split(command)
    target = None
    if ">" in args:
        target = args[args.index(">") + 1]
        args = args[: args.index(">")]
    result = stagetrail(args, command)
    if target is not None:
        (cwd / target).write_text(result.stdout)
        return result.stderr
    return first_lines(result.stdout + result.stderr, limit)


def transcript(block: str, cwd: Path) -> str:
    """The block regenerated: each command followed by what it prints."""
    return "".join(f"$ {command}\n{run(command, cwd)}" for command in commands(block))


class _Killed(BaseException):
    """Stops the coordinator's driver at a point, as the demo's SIGKILL stops its child."""


def _stop_at(n: int) -> coordinator.Hook:
    seen = {"points": 0}

    def hook(point: str) -> None:
        seen["points"] += 1
        if seen["points"] == n:
            raise _Killed(point)

    return hook


def interrupted_then_resumed(engine: Engine, url: str, at: int = 6) -> Run:
    """`coordinator.killed_then_resumed` in this process: the driver stops at point `at`
    with nothing after its last commit, as a SIGKILL leaves it, then the run is resumed."""
    run = coordinator.start(engine)
    with contextlib.suppress(_Killed):
        coordinator.coordinate(engine, run, _stop_at(at))
    return coordinator.coordinate(engine, engine.resume(run.id))


@pytest.fixture
def demo_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty directory with the default store, fixed times and a seeded run id sequence."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STAGETRAIL_STORE", raising=False)
    monkeypatch.delenv("STAGETRAIL_CIPHER_KEY", raising=False)
    monkeypatch.delenv("STAGETRAIL_CHAIN_KEY", raising=False)
    monkeypatch.setenv("COLUMNS", "100")  # click wraps --help at min(COLUMNS, 80)
    seeded = random.Random(20261120)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=seeded.getrandbits(128), version=4))
    # The demo SIGKILLs the coordinator example in a child process, which neither the
    # frozen clock nor the seeded ids reach: it is stopped at the same point in this
    # process instead, which records the same events (TestTheDemoInProcess).
    monkeypatch.setattr(coordinator, "killed_then_resumed", interrupted_then_resumed)
    with transcript_clock("2026-11-20 09:00:00"):
        yield tmp_path


class TestTranscript:
    def test_cli_md_matches_the_commands(self, demo_directory: Path) -> None:
        """Every console block of docs/cli.md is the real output of its commands, in order."""
        check_page(PAGE, lambda index, block: transcript(block, demo_directory))

    def test_every_command_has_a_section(self) -> None:
        """docs/cli.md has a section, and a transcript, for each command of the program."""
        text = PAGE.read_text()
        shown = {command.split()[1] for block in BLOCK.findall(text) for command in commands(block)}
        assert set(main.commands) <= shown
        headings = [line for line in text.splitlines() if line.startswith("## ")]
        for name in main.commands:
            assert any(f"`stagetrail {name}" in heading for heading in headings), name


def _history(engine: Engine, run: Run) -> list[tuple[object, ...]]:
    """What a run and its child runs recorded, without ids and times."""
    return [
        (type(event).__name__, *(getattr(event, name, None) for name in _FIELDS))
        for member in engine.tree(run.id)
        for event in engine.events(member)
    ]


_FIELDS = ("stage", "attempt", "outcome", "error_type", "error", "task_id", "status")


class TestTheDemoInProcess:
    def test_it_records_what_the_killed_child_records(self, tmp_path: Path) -> None:
        """Stopped in process at the demo's kill point, the coordinator records the same
        events as when the demo SIGKILLs its child process there: the transcript's counts
        are a real demo's."""
        killed_url = f"sqlite:///{tmp_path / 'killed.db'}"
        with Engine(killed_url) as engine:
            killed = _history(engine, coordinator.killed_then_resumed(engine, killed_url))
        in_process_url = f"sqlite:///{tmp_path / 'in_process.db'}"
        with Engine(in_process_url) as engine:
            stopped = _history(engine, interrupted_then_resumed(engine, in_process_url))
        assert stopped == killed
        assert ("StageFailed", "build", 1, "failed", "Interrupted") in [h[:5] for h in stopped]
