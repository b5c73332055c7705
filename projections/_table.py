"""Reading a pipeline's transition table from the data `RunStarted` carries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def lookup(table: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """`{state: {outcome: dest}}` from a stored table, `'*'` rows expanded.

    A `'*'` row applies to every non-final state without its own row for that outcome.
    """
    finals = set(table.get("final", ()))
    rows = [tuple(row) for row in table.get("transitions", ())]
    states = list(table.get("states", ())) or sorted({r[0] for r in rows} | {r[2] for r in rows})
    moves: dict[str, dict[str, str]] = {s: {} for s in states if s != "*"}
    for source, outcome, dest in rows:
        if source != "*":
            moves.setdefault(source, {})[outcome] = dest
    for source, outcome, dest in rows:
        if source == "*":
            for state, outcomes in moves.items():
                if state not in finals:
                    outcomes.setdefault(outcome, dest)
    return moves
