"""Reading a pipeline's transition table from the data `RunStarted` carries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from events import JSON

ANY_STATE = "*"
"""The source of a table row that applies to every non-final state lacking its own row."""

Lookup = Mapping[tuple[str, str], str]
"""A table as a lookup: (state, outcome) → the state it leads to."""


def lookup(table: JSON) -> dict[tuple[str, str], str]:
    """The `(state, outcome) -> dest` lookup of a stored table, `"*"` rows expanded.

    Malformed rows are skipped: a projection folds what the engine already checked.
    """
    if not isinstance(table, Mapping):
        return {}
    rows = [tuple(row) for row in table.get("transitions") or () if _is_row(row)]
    result = {(source, outcome): dest for source, outcome, dest in rows if source != ANY_STATE}
    final = set(table.get("final") or ())
    states = table.get("states") or _states(initial_state(table), rows)
    for _, outcome, dest in (row for row in rows if row[0] == ANY_STATE):
        for state in states:
            if state not in final:
                result.setdefault((state, outcome), dest)
    return result


def initial_state(table: JSON) -> str | None:
    initial = table.get("initial") if isinstance(table, Mapping) else None
    return initial if isinstance(initial, str) else None


def _is_row(row: object) -> bool:
    return isinstance(row, list | tuple) and len(row) == 3 and all(type(x) is str for x in row)


def _states(initial: str | None, rows: list[tuple[Any, ...]]) -> list[str]:
    named = [initial] if initial is not None else []
    named += [name for source, _, dest in rows for name in (source, dest) if name != ANY_STATE]
    return list(dict.fromkeys(named))


def rows(moves: Lookup) -> list[list[str]]:
    """A lookup as sorted ``[state, outcome, dest]`` rows (its JSON form)."""
    return sorted([state, outcome, dest] for (state, outcome), dest in moves.items())


def from_rows(data: Any) -> dict[tuple[str, str], str]:
    """The lookup `rows` turned into JSON."""
    return {(state, outcome): dest for state, outcome, dest in data}
