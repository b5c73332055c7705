"""Several processes appending to one run: conflicts, retries, never a lost or doubled event."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from engine import Engine
from events import NoteAdded
from tests._helpers import REVIEW

WRITER = textwrap.dedent(
    """
    import sys
    from engine import ConcurrencyConflict, Engine

    url, run_id, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    conflicts = 0
    with Engine(url) as engine:
        run = engine.load(run_id)
        for index in range(count):
            while True:
                try:
                    run.note(name, index)
                    break
                except ConcurrencyConflict:
                    conflicts += 1
                    run.refresh()
    print(conflicts)
    """
)


@pytest.mark.slow
class TestWritersInManyProcesses:
    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    def test_every_note_lands_exactly_once(
        self, backend: str, request: pytest.FixtureRequest
    ) -> None:
        """Three processes racing on one run: consecutive versions, each note once, in order."""
        url = request.getfixturevalue(backend)
        with Engine(url) as engine:
            run_id = str(engine.start_run(REVIEW).id)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", WRITER, url, run_id, name, "150"],
                cwd=root,
                stdout=subprocess.PIPE,
                text=True,
            )
            for name in ("a", "b", "c")
        ]
        outputs = [writer.communicate()[0] for writer in writers]
        assert all(writer.returncode == 0 for writer in writers), outputs
        with Engine(url) as engine:
            notes = engine.events(run_id)[1:]
        assert [event.version for event in notes] == list(range(2, 452))
        assert all(isinstance(note, NoteAdded) for note in notes)
        for name in ("a", "b", "c"):
            mine = [note.value for note in notes if note.key == name]  # type: ignore[attr-defined]
            assert mine == list(range(150))
