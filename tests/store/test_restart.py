"""A PostgreSQL server restarted mid-run: the engine recovers without restarting its process.

The shared server is never restarted: the test starts its own private cluster
(initdb into a temporary directory, on a free port), restarts that one, and
removes it afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine, StoreError
from engine.errors import OutcomeUnknown
from events import NoteAdded
from tests._helpers import REVIEW
from tests.store.postgres.test_open import _append_following_the_advice


class Cluster:
    """A private PostgreSQL cluster: its directory, port and pg_ctl."""

    def __init__(self, root: Path, bin_dir: str, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port
        self.bin_dir = bin_dir

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, *args: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=120)

    def pg_ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.run(
            f"{self.bin_dir}/pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"),
            "-o", options, "-w", "-m", "fast", action, *extra,
        )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A private cluster started for the test and removed after it."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.skip("no PostgreSQL server binaries (initdb) installed")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: cannot start a cluster as postgres")
    root = Path(tempfile.mkdtemp(prefix="stagetrail-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    made = Cluster(root, os.path.dirname(found[-1]), _free_port())
    try:
        made.run(found[-1], "-D", str(made.data), "-U", "postgres", "--auth=trust", "-N")
        made.pg_ctl("start")
        yield made
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # never started
            made.pg_ctl("stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
class TestServerRestart:
    APPENDS = 400

    def test_the_engine_recovers_from_a_restart_in_process(self, cluster: Cluster) -> None:
        """400 appends with a server restart after the 100th: all stored once, reads work."""
        stats = {"conflicts": 0, "unknown": 0, "store_errors": 0}
        written = threading.Event()
        with Engine(f"{cluster.url}?schema=runs") as engine:
            run = engine.start_run(REVIEW)
            engine.runs()

            def write() -> None:
                for index in range(self.APPENDS):
                    _append_following_the_advice(engine, run, "n", index, stats)
                    if index == 100:
                        written.set()

            writer = threading.Thread(target=write)
            writer.start()
            assert written.wait(120)
            cluster.pg_ctl("restart")
            writer.join(180)
            assert not writer.is_alive()
            recovered = dict(engine.store.recorder.recovered)  # type: ignore[attr-defined]
            summaries = engine.runs()  # the same engine reads on after the restart
            values = [e.value for e in engine.events(run.id)[1:]]  # type: ignore[attr-defined]
        print(f"recovered={recovered} advice={stats}")
        assert values == list(range(self.APPENDS))
        assert [s.run_id for s in summaries] == [run.id]
        assert summaries[0].attempts == 0
        assert stats["conflicts"] == 0

    def test_a_server_down_for_longer_than_the_retries_is_outcome_unknown(
        self, cluster: Cluster
    ) -> None:
        """With the server down past the retry time: OutcomeUnknown, then refresh() resolves it."""
        with Engine(f"{cluster.url}?schema=runs") as engine:
            run = engine.start_run(REVIEW)
            engine.store.recorder.retry_seconds = 1.0  # type: ignore[attr-defined]
            cluster.pg_ctl("stop")
            with pytest.raises(OutcomeUnknown, match=r"call run\.refresh\(\)") as caught:
                run.note("k", "lost?")  # its pooled connection died with the server
            assert "\n" not in str(caught.value)
            assert isinstance(caught.value, StoreError)
            cluster.pg_ctl("start")
            run.refresh()
            newest = engine.store.last(run.id)
            if not (isinstance(newest, NoteAdded) and newest.value == "lost?"):
                run.note("k", "lost?")  # the advice: not stored, so record it again
            values = [e.value for e in engine.events(run.id)[1:]]  # type: ignore[attr-defined]
        assert values == ["lost?"]
