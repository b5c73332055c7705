"""The viewer's collector policy: freeze after a request, collect when idle, not in library use."""

from __future__ import annotations

import gc
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from starlette.testclient import TestClient

from engine import Engine
from engine.readside.snapshots import _Snapshots
from engine.ui import create_app
from engine.ui.collector import IdleCollector
from tests.ui._helpers import record_hostile, record_long


class Cycle:
    """An object that refers to itself: only a collection frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Each test starts and ends with nothing frozen."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def folded_states() -> list[Any]:
    """The in-memory snapshots of folds that the next full collection would walk."""
    return [found for found in gc.get_objects() if isinstance(found, _Snapshots) and found.states]


class TestIdleCollector:
    def test_freezes_after_a_fold_is_cached(self, tmp_path: Path) -> None:
        """A state answer's cached folds are frozen: no collection walks them."""
        url = f"sqlite:///{tmp_path / 'viewer.db'}"
        run_id = record_long(url, failures=150)
        collector = IdleCollector()
        with TestClient(collector.wrap(create_app(url)), base_url="http://127.0.0.1") as client:
            answer = client.get(f"/api/runs/{run_id}/state?at=300")
            assert answer.status_code == 200
            assert gc.get_freeze_count() > 0
            assert folded_states() == []
            gc.unfreeze()
            assert folded_states() != []

    def test_a_cycle_made_during_a_request_is_freed_once_idle(self) -> None:
        """A cycle frozen with a request survives collections until the idle collection frees it."""
        with freeze_time("2026-11-27 06:00:00") as clock:
            collector = IdleCollector(idle=1.5, clock=time.monotonic)
            collector.started()
            cycle = Cycle()
            freed = weakref.ref(cycle)
            collector.finished()
            del cycle
            gc.collect()
            assert freed() is not None
            assert collector.collect_if_idle() is False
            clock.tick(2)
            assert collector.collect_if_idle() is True
            assert freed() is None
            assert gc.get_freeze_count() > 0

    def test_does_not_collect_while_a_request_is_in_flight(self) -> None:
        """However long ago a request ended, nothing is collected while another one runs."""
        with freeze_time("2026-11-27 06:00:00") as clock:
            collector = IdleCollector(idle=1.5, clock=time.monotonic)
            collector.started()
            collector.started()
            collector.finished()
            clock.tick(10)
            assert collector.collect_if_idle() is False
            collector.finished()
            clock.tick(2)
            assert collector.collect_if_idle() is True
            assert collector.collect_if_idle() is False

    def test_serving_collects_from_its_own_thread(self) -> None:
        """While serving, a thread runs the idle collection by itself; it unfreezes at the end."""
        now = [0.0]  # the watching thread's own clock, moved by the test (freezegun spares threads)
        collector = IdleCollector(idle=0.05, clock=lambda: now[0])
        with collector.serving():
            collector.started()
            cycle = Cycle()
            freed = weakref.ref(cycle)
            collector.finished()
            del cycle
            now[0] = 1.0
            assert collector.swept.wait(timeout=30)
            assert freed() is None
        assert gc.get_freeze_count() == 0

    def test_library_use_leaves_the_collector_alone(self, tmp_path: Path) -> None:
        """Importing engine.ui and serving its app without `stagetrail ui` leave gc as it was."""
        url = f"sqlite:///{tmp_path / 'viewer.db'}"
        with Engine(url) as engine:
            run_id = record_hostile(engine)
        script = (
            "import gc, sys, threading\n"
            "before = (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())\n"
            "import engine.ui, engine.ui.collector\n"
            "from starlette.testclient import TestClient\n"
            f"with TestClient(engine.ui.create_app({url!r}), base_url='http://127.0.0.1') as c:\n"
            f"    assert c.get('/api/runs/{run_id}/state?at=3').status_code == 200\n"
            "after = (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())\n"
            "names = [t.name for t in threading.enumerate()]\n"
            "print(before == after, 'stagetrail-ui-collector' in names, after)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        )
        assert done.stdout.split()[:2] == ["True", "False"], done.stdout
