"""What a transition table means: its rows, the `"*"` rows expanded, its states, its checks.

The one owner of table semantics. `engine.pipeline.Pipeline` validates a
definition with these checks and compiles `expand`'s rows; projections read a
table stored in `RunStarted` through `lookup`, which expands it the same way.
Each check raises one clear `PipelineError`.

A table may declare a hub (`check_hub`): a state that routes to each of its
nodes implicitly (`implicit_route`), so an outcome of a node recorded in the hub
reads as the hub's route to it (a decided outcome: no attempt) followed by that
outcome, as if the route had been recorded first.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from events._strict_json import JSON
from events.errors import PipelineError
from events.storable import unstorable_text

ANY = "*"
"""The source of a row that applies to every non-final state lacking its own row."""

Row = tuple[str, str, str]
"""One row of a table: ``(source, outcome, dest)``."""

Lookup = Mapping[tuple[str, str], str]
"""A table as a lookup: (state, outcome) → the state it leads to."""


def check_name(kind: str, value: object, pipeline: str) -> str:
    """Return `value` if it is a non-empty str every store can keep, else raise naming `kind`."""
    if type(value) is not str or not value:
        raise PipelineError(pipeline, f"{kind} must be a non-empty str, got {value!r}")
    problem = unstorable_text(value)
    if problem is not None:
        raise PipelineError(pipeline, f"{kind} {value!r} {problem}")
    return value


def check_state(kind: str, value: object, pipeline: str) -> str:
    """Return `value` if it can name a state: a non-empty str other than ``'*'``."""
    name = check_name(kind, value, pipeline)
    if name == ANY:
        raise PipelineError(pipeline, f"{kind} cannot be '*'; '*' may only be a row's source")
    return name


def state_list(kind: str, values: object, pipeline: str) -> tuple[str, ...]:
    """Return a list of state names (`final`, `states`) as a tuple without duplicates."""
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise PipelineError(
            pipeline, f"{kind} must be a list of state names, got {values!r} (write {kind}=[...])"
        )
    item = "final state" if kind == "final" else "state"
    names = tuple(check_state(item, value, pipeline) for value in values)
    duplicates = sorted(name for name, seen in Counter(names).items() if seen > 1)
    if duplicates:
        raise PipelineError(pipeline, f"{kind} lists {', '.join(map(repr, duplicates))} twice")
    return names


def normalise_rows(pipeline: str, rows: object) -> tuple[Row, ...]:
    """Return the rows as `(source, outcome, dest)` tuples of non-empty strs."""
    if isinstance(rows, str) or not isinstance(rows, Iterable):
        raise PipelineError(pipeline, f"transitions must be a list of rows, got {rows!r}")
    checked = tuple(_row(pipeline, row) for row in rows)
    if not checked:
        raise PipelineError(pipeline, "the transition table is empty")
    return checked


def _row(pipeline: str, row: object) -> Row:
    if not isinstance(row, tuple | list) or len(row) != 3:
        raise PipelineError(pipeline, f"row {row!r} is not a (source, outcome, dest) triple")
    source, outcome, dest = (
        check_name(k, v, pipeline) for k, v in zip(("source", "outcome", "dest"), row, strict=True)
    )
    if ANY in (outcome, dest):
        raise PipelineError(pipeline, f"row {tuple(row)!r}: '*' may only be a source")
    return (source, outcome, dest)


def check_hub(
    pipeline: str, hub: object, states: Sequence[str], final: Sequence[str]
) -> str | None:
    """Return the declared hub (None: the table has none), a declared non-final state, or raise."""
    if hub is None:
        return None
    name = check_state("hub", hub, pipeline)
    if name not in states:
        raise PipelineError(pipeline, f"hub {name!r} is not a declared state")
    if name in final:
        raise PipelineError(pipeline, f"hub {name!r} is a final state: nothing is routed from it")
    return name


def implicit_route(hub: str | None, state: str, stage: str, routed_to: str | None) -> bool:
    """Whether an outcome of `stage` recorded in `state` takes the hub's implicit route first.

    It does when the table declares `hub`, the run is in it, and the hub's row for the
    outcome named `stage` leads to `stage` itself (`routed_to`, the row ``(hub, stage,
    stage)``): the outcome then reads as that route, a decided outcome that moves the
    run to `stage` and counts no attempt, followed by the stage's own outcome.
    """
    return hub is not None and state == hub and stage != hub and routed_to == stage


def took_implicit_route(moves: Lookup, state: str, stage: str) -> bool:
    """Whether a checked outcome of `stage`, recorded in `state`, took a hub's implicit route.

    For folds of a history the engine has checked: an outcome names the run's state
    unless it took the route, so only the route's row is looked at (`implicit_route`
    with `state` as the hub).
    """
    return stage != state and implicit_route(state, state, stage, moves.get((state, stage)))


def hub_of(table: JSON) -> str | None:
    """The hub a stored table declares, or None (a table stored before hubs declares none)."""
    mapping = type(table) is dict or isinstance(table, Mapping)  # dict: no ABC check
    hub = table.get("hub") if mapping else None
    return hub if isinstance(hub, str) else None


def derive_states(
    initial: str | None, rows: Sequence[Row], final: Sequence[str]
) -> tuple[str, ...]:
    """The states named by the definition, in order of first mention."""
    named = [] if initial is None else [initial]
    for source, _, dest in rows:
        named += [s for s in (source, dest) if s != ANY]
    return tuple(dict.fromkeys([*named, *final]))


def check_known(
    pipeline: str, states: Sequence[str], initial: str, rows: Sequence[Row], final: Sequence[str]
) -> None:
    """Every state the rows, `initial` and `final` name must be declared."""
    known = set(states)
    if initial not in known:
        raise PipelineError(pipeline, f"initial state {initial!r} is not a declared state")
    for state in final:
        if state not in known:
            raise PipelineError(pipeline, f"final state {state!r} is not a declared state")
    for row in rows:
        for state in (row[0], row[2]):
            if state != ANY and state not in known:
                raise PipelineError(pipeline, f"row {row!r} names unknown state {state!r}")


def check_rows(pipeline: str, initial: str, rows: Sequence[Row], final: Sequence[str]) -> None:
    """No duplicate `(source, outcome)`, no row leaving a final state."""
    if not final:
        raise PipelineError(pipeline, "no final state: a run could never end")
    if initial in final:
        raise PipelineError(pipeline, f"initial state {initial!r} is final: nothing to run")
    seen: set[tuple[str, str]] = set()
    for row in rows:
        key = (row[0], row[1])
        if key in seen:
            raise PipelineError(pipeline, f"duplicate row for state {row[0]!r}, outcome {row[1]!r}")
        seen.add(key)
        if row[0] in final:
            raise PipelineError(pipeline, f"final state {row[0]!r} has an outgoing row {row!r}")


def expand(rows: Sequence[Row], states: Sequence[str], final: Sequence[str]) -> list[Row]:
    """Replace each `'*'` row by one row per non-final state lacking that outcome."""
    explicit = {(s, o) for s, o, _ in rows if s != ANY}
    expanded = [row for row in rows if row[0] != ANY]
    for _, outcome, dest in (row for row in rows if row[0] == ANY):
        expanded += [
            (state, outcome, dest)
            for state in states
            if state not in final and (state, outcome) not in explicit
        ]
    return expanded


def check_graph(
    pipeline: str, states: Sequence[str], initial: str, rows: Sequence[Row], final: Sequence[str]
) -> None:
    """Every state is reachable from `initial`; every non-final state has a way out."""
    successors: dict[str, set[str]] = {state: set() for state in states}
    for source, _, dest in rows:
        successors[source].add(dest)
    unreachable = set(states) - _reachable(initial, successors)
    if unreachable:
        names = ", ".join(repr(s) for s in states if s in unreachable)
        raise PipelineError(pipeline, f"unreachable from {initial!r}: {names}")
    dead_ends = [s for s in states if s not in final and not successors[s]]
    if dead_ends:
        names = ", ".join(repr(s) for s in dead_ends)
        raise PipelineError(pipeline, f"non-final state(s) with no outgoing row: {names}")


def _reachable(initial: str, successors: dict[str, set[str]]) -> set[str]:
    seen = {initial}
    queue = deque([initial])
    while queue:
        for nxt in successors[queue.popleft()] - seen:
            seen.add(nxt)
            queue.append(nxt)
    return seen


def lookup(table: JSON) -> dict[tuple[str, str], str]:
    """The `(state, outcome) -> dest` lookup of a stored table, `"*"` rows expanded.

    Malformed rows are skipped: a projection folds what the engine already checked.
    Every fold of a run starts here, so the expansion is kept per table (a copy is
    returned).
    """
    if type(table) is not dict and not isinstance(table, Mapping):  # dict: no ABC check
        return {}
    global _LAST
    get = table.get
    read = (get("initial"), get("final"), get("states"), get("transitions"))
    last = _LAST  # one triple, replaced whole: a thread reads one table's parts and expansion
    kept = last[0]
    # The newest table again (a run's, read by every fold of it): compared as it is, in C,
    # with no key built. Equal parts give an equal `_table_key`: the same expansion. Where
    # it has no "*" row, its rows and final states make it (its states given: none derived
    # from its initial state), whatever its states are: only those are compared.
    if last[2] and read[3] == kept[3] and read[1] == kept[1] and read[2]:
        return dict(last[1])
    if read == kept:
        return dict(last[1])
    key = _table_key(read)
    if key is None:
        return _expanded(table)
    found = _LOOKUPS.get(key)
    if found is None:
        if len(_LOOKUPS) >= _LOOKUPS_KEPT:
            _LOOKUPS.clear()
        parts = _json_copy(read)
        found = _LOOKUPS[key] = (parts, _expanded(table), parts is not None and _rows_only(parts))
    if found[0] is not None:
        _LAST = found
    return dict(found[1])


_Kept = tuple[Any, dict[tuple[str, str], str], bool]
"""A table's parts as `lookup` copied them (None: not kept), its expansion, and whether its
rows alone make it (`_rows_only`)."""
_LOOKUPS: dict[Any, _Kept] = {}
_LOOKUPS_KEPT = 256
_LAST: _Kept = (None, {}, False)
"""`lookup`'s newest table (a copy made once per key kept, not per look-up)."""


def _json_copy(read: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A copy of a table's parts (initial, final, states, transitions) that no change to
    the table reaches, or None where a part is not a list (not kept). Asked only of parts
    `_table_key` keyed (each row hashable): a part or row of another type than the list
    copied never equals its copy, so the next look-up only misses."""
    initial, final, states, transitions = read
    if not (
        (final is None or type(final) is list)
        and (states is None or type(states) is list)
        and (transitions is None or type(transitions) is list)
    ):
        return None
    rows = None if transitions is None else list(map(list, transitions))
    return (
        initial,
        None if final is None else list(final),
        None if states is None else list(states),
        rows,
    )


def _rows_only(parts: tuple[Any, ...]) -> bool:
    """Whether a table's expansion is its rows alone, whatever its initial state and its
    states where it names some (`_json_copy`'s parts): it has rows (a list), none of them a
    `"*"` row."""
    rows = parts[3]
    return type(rows) is list and not any(_is_row(row) and row[0] == ANY for row in rows)


def _table_key(read: tuple[Any, ...]) -> Any:
    """A hashable form of what `lookup` reads from a table (its initial, final, states and
    transitions), or None for odd tables."""
    initial, final, states, transitions = read
    try:
        rows = tuple(map(tuple, transitions or ()))
        # A row that is no list or tuple ("abc") is skipped, yet keys (and copies, see
        # `_json_copy`) as the row of its items would: such a table is not kept.
        if not all(isinstance(row, list | tuple) for row in transitions or ()):
            return None
        key = (initial, tuple(final or ()), tuple(states or ()), rows)
        hash(key)
        return key
    except TypeError:  # an unhashable or non-iterable part: not worth caching
        return None


def _expanded(table: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    rows = [(row[0], row[1], row[2]) for row in table.get("transitions") or () if _is_row(row)]
    final = tuple(table.get("final") or ())
    states = table.get("states") or derive_states(initial_state(table), rows, final)
    return {(source, outcome): dest for source, outcome, dest in expand(rows, states, final)}


def read_table(table: JSON) -> tuple[str | None, dict[tuple[str, str], str], str | None]:
    """A stored table's initial state, lookup and hub (`initial_state`, `lookup`, `hub_of`) in
    one call: what a fold takes from a run's `RunStarted`."""
    if type(table) is not dict and not isinstance(table, Mapping):  # dict: no ABC check
        return None, {}, None
    initial, hub = table.get("initial"), table.get("hub")
    return (
        initial if isinstance(initial, str) else None,
        lookup(table),
        hub if isinstance(hub, str) else None,
    )


def initial_state(table: JSON) -> str | None:
    """The initial state a stored table names, or None when it names none."""
    mapping = type(table) is dict or isinstance(table, Mapping)  # dict: no ABC check
    initial = table.get("initial") if mapping else None
    return initial if isinstance(initial, str) else None


def _is_row(row: object) -> bool:
    return isinstance(row, list | tuple) and len(row) == 3 and all(type(x) is str for x in row)


def as_rows(moves: Lookup) -> list[list[str]]:
    """A lookup as sorted ``[state, outcome, dest]`` rows (its JSON form)."""
    return sorted([state, outcome, dest] for (state, outcome), dest in moves.items())


def from_rows(data: Any) -> dict[tuple[str, str], str]:
    """The lookup `as_rows` turned into JSON."""
    return {(state, outcome): dest for state, outcome, dest in data}
