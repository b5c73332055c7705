"""Over 200 SIGKILL trials per backend, at random moments: nothing acknowledged is lost,
nothing is doubled, no batch is half-written, every run verifies, resume records what
was interrupted, and killed catch-ups equal a rebuild (see `tests/faults/trials.py`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._helpers import POSTGRES_URL, require_postgres

ROOT = Path(__file__).resolve().parent.parent.parent
RUNNERS = 3
"""Trial processes per backend, each on its own store, side by side."""
TRIALS = 70
"""Trials per process: 210 per backend."""


@pytest.fixture
def postgres_urls() -> Iterator[list[str]]:
    """One fresh PostgreSQL schema per runner, dropped afterwards."""
    require_postgres()
    import psycopg
    from psycopg import sql

    schemas = [f"t_{uuid.uuid4().hex[:16]}" for _ in range(RUNNERS)]
    yield [f"{POSTGRES_URL}?schema={schema}" for schema in schemas]
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def sqlite_urls(tmp_path: Path) -> list[str]:
    """One SQLite file per runner."""
    return [f"sqlite:///{tmp_path / f'runs{number}.db'}" for number in range(RUNNERS)]


def run_trials(urls: list[str], trials: int) -> list[dict[str, Any]]:
    """Run the trial processes side by side; their JSON reports."""
    command = [sys.executable, "-m", "tests.faults.trials"]
    runners = [
        subprocess.Popen(
            [*command, url, "--trials", str(trials), "--seed", str(seed)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed, url in enumerate(urls, start=1)
    ]
    outputs = [runner.communicate(timeout=280) for runner in runners]
    for runner, (_, err) in zip(runners, outputs, strict=True):
        assert runner.returncode == 0, err[-4000:]
    return [json.loads(out) for out, _ in outputs]


@pytest.mark.slow
class TestSigkillTrials:
    @pytest.mark.parametrize("backend", ["sqlite_urls", "postgres_urls"])
    def test_random_kills_lose_and_double_nothing(
        self, backend: str, request: pytest.FixtureRequest
    ) -> None:
        """210 kills: every check of every trial holds, and kills landed in every kind of step."""
        reports = run_trials(request.getfixturevalue(backend), TRIALS)
        places: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        for report in reports:
            places.update(report["places"])
            counts.update(report["counts"])
        print(backend, json.dumps({"places": places, "counts": counts}))
        assert sum(places.values()) == RUNNERS * TRIALS >= 200
        steps = {place.removesuffix("_commit") for place in places}
        assert {"batch", "drive", "task", "catch_up"} <= steps
        assert counts["interrupted_attempts"] > 0
        assert counts["interrupted_tasks"] > 0
        assert counts["acknowledged_events"] > 0
        assert counts["projections_checked"] == 9 * RUNNERS
