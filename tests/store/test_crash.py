"""A writer killed with SIGKILL loses no acknowledged event and leaves no half batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from engine import Engine
from events import NoteAdded

BATCH = 10

WRITER = textwrap.dedent(
    """
    import sys
    from engine import Engine
    from tests._helpers import REVIEW

    engine = Engine(sys.argv[1])
    run = engine.start_run(REVIEW)
    print(run.id, flush=True)
    batch = 0
    while True:
        with run.batch():
            for item in range(int(sys.argv[2])):
                run.note("batch", [batch, item])
        print(batch, flush=True)  # acknowledged: committed before this line
        batch += 1
    """
)


def kill_writer_after(url: str, acknowledged: int) -> tuple[str, int]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, str(BATCH)], stdout=subprocess.PIPE, text=True, cwd=root
    )
    assert child.stdout is not None
    run_id = child.stdout.readline().strip()
    for _ in range(acknowledged):
        last = int(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait()
    return run_id, last


@pytest.mark.slow
class TestKilledWriter:
    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    @pytest.mark.parametrize("acknowledged", [1, 7, 40])
    def test_sigkill_keeps_every_acknowledged_batch_whole(
        self, backend: str, acknowledged: int, request: pytest.FixtureRequest
    ) -> None:
        """After SIGKILL the store holds whole batches only, at least all acknowledged ones."""
        url = request.getfixturevalue(backend)
        run_id, last = kill_writer_after(url, acknowledged)
        with Engine(url) as engine:
            notes = engine.events(run_id)[1:]
            assert all(isinstance(note, NoteAdded) for note in notes)
            values = [note.value for note in notes]  # type: ignore[attr-defined]
            batches = len(values) // BATCH
            assert len(values) % BATCH == 0
            assert batches >= last + 1
            assert values == [[b, i] for b in range(batches) for i in range(BATCH)]
            resumed = engine.load(run_id)
            resumed.note("after", "restart")
            assert resumed.version == 2 + len(values)
