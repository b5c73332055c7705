"""Differential check: every write path stores the bytes an earlier release stored."""

from __future__ import annotations

import json
from pathlib import Path

from tests._helpers import POSTGRES_URL, require_postgres
from tests.store.appended_bytes import FIXTURE, scenarios


def _mismatches(found: dict[str, list[str]]) -> list[tuple[str, int]]:
    """Each scenario whose rows differ from the fixture's, with its first differing row."""
    expected = json.loads(FIXTURE.read_text())
    wrong = []
    for name, rows in found.items():
        if rows != expected[name]:
            pairs = enumerate(zip(rows, expected[name], strict=False))
            first = next((i for i, (row, want) in pairs if row != want), len(rows))
            wrong.append((name, first))
    return wrong


class TestAppendedBytes:
    """The stored JSON (and so each link) of seeded histories, against `FIXTURE`."""

    def test_memory_and_sqlite_stores_hold_the_fixtures_bytes(self, tmp_path: Path) -> None:
        """Plain, keyed, compressed and encrypted memory and SQLite stores, and a store the
        first release wrote, hold the rows the fixture's code wrote, in its order."""
        found = scenarios(tmp_path)
        assert len(found) == 9
        assert _mismatches(found) == []

    def test_postgresql_stores_hold_the_fixtures_bytes(self, tmp_path: Path) -> None:
        """The same histories in PostgreSQL schemas hold the fixture's rows."""
        require_postgres()
        found = scenarios(tmp_path, POSTGRES_URL)
        assert {name for name in found if name.startswith("postgresql")} == {
            "postgresql-plain",
            "postgresql-keyed",
            "postgresql-zlib",
            "postgresql-cipher-zlib",
        }
        assert _mismatches(found) == []
