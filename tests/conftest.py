"""Shared fixtures: one parametrised store URL per backend, each test its own store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import freezegun
import pytest
from hypothesis import settings

from engine import Engine
from tests._helpers import POSTGRES_URL, require_browser, require_postgres

# A PostgreSQL pool's scheduler thread times its own stop: under frozen time it never stops,
# and a thread left running keeps later long folds from slowing the collector down
# (tests/projections/test_collector.py failed after tests/store/test_appended_bytes.py).
freezegun.configure(extend_ignore_list=["psycopg_pool"])

BACKENDS = ["memory", "sqlite", "postgres"]

# No example has a deadline: speed is measured in benchmarks/, never by a test's clock (a
# property test near Hypothesis's default 200 ms failed once on a loaded 2-core host).
settings.register_profile("stagetrail", deadline=None)
settings.load_profile("stagetrail")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A `browser` test skips when Chromium is absent (fails if STAGETRAIL_REQUIRE_BROWSER=1)."""
    if item.get_closest_marker("browser") is not None:
        require_browser()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A PostgreSQL store URL in a fresh schema, dropped after the test."""
    require_postgres()
    import psycopg
    from psycopg import sql

    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield f"{POSTGRES_URL}?schema={schema}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite store URL for a file in the test's own directory."""
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each backend in turn: memory, SQLite file, PostgreSQL schema."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store two engines (or processes) can open: a SQLite file or a PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    """An engine over a fresh store of each backend."""
    with Engine(store_url) as opened:
        yield opened
