"""Shared fixtures: one parametrised store URL per backend, each test its own store."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine
from examples.code_review import REVIEW as CODE_REVIEW

POSTGRES_URL = os.environ.get(
    "STAGETRAIL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
BACKENDS = ["memory", "sqlite", "postgres"]

REVIEW = CODE_REVIEW
"""The review pipeline of DESIGN.md, as the examples define it."""


def _postgres_problem() -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg.Error as error:
        return f"no PostgreSQL reachable at {POSTGRES_URL}: {str(error).strip()}"
    return None


def require_postgres() -> None:
    """Skip the test when PostgreSQL is unreachable, or fail under STAGETRAIL_REQUIRE_POSTGRES=1."""
    problem = _postgres_problem()
    if problem is None:
        return
    if os.environ.get("STAGETRAIL_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"STAGETRAIL_REQUIRE_POSTGRES=1 but {problem}")
    pytest.skip(problem)


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


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    """An engine over a fresh store of each backend."""
    with Engine(store_url) as opened:
        yield opened
