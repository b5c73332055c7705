"""A pipeline: a named, validated transition table (states x outcomes -> states)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from engine import diagram
from engine.errors import PipelineError
from events import table

Row = table.Row


class Pipeline:
    """A pipeline definition, declared and validated through `transitions`.

    The table is validated when built; the `transitions` machine built from it
    is the single source of truth, compiled once to a plain dict lookup for the
    hot path (no run object is ever bound to the machine).

    Args:
        name: the pipeline's name.
        initial: the state a run starts in.
        transitions: rows ``(source, outcome, dest)``; ``source`` may be ``"*"``,
            any non-final state without its own row for that outcome.
        final: the states in which a run has nowhere left to go.
        states: all states, in display order; derived from the rows if omitted.
        hub: a state that routes to its nodes implicitly (`events.table.implicit_route`):
            in it, an outcome of a stage X with the row ``(hub, X, X)`` is taken as the
            route to X then X's outcome. None (the default): every outcome must name
            the run's state.

    Raises:
        PipelineError: naming the problem (unknown or unreachable state, duplicate
            row, final state with an outgoing row, empty table, dead end).
    """

    __slots__ = ("_lookup", "final", "hub", "initial", "name", "rows", "states")

    def __init__(
        self,
        name: str,
        *,
        initial: str,
        transitions: Iterable[Sequence[str]],
        final: Iterable[str],
        states: Iterable[str] | None = None,
        hub: str | None = None,
    ) -> None:
        self.name = table.check_name("pipeline name", name, repr(name))
        self.initial = table.check_state("initial state", initial, name)
        self.rows = table.normalise_rows(name, transitions)
        self.final = table.state_list("final", final, name)
        self.states = self._states(states)
        self.hub = table.check_hub(name, hub, self.states, self.final)
        self._lookup = self._compile()

    def _states(self, states: Iterable[str] | None) -> tuple[str, ...]:
        table.check_rows(self.name, self.initial, self.rows, self.final)
        derived = table.derive_states(self.initial, self.rows, self.final)
        if states is None:
            return derived
        declared = table.state_list("states", states, self.name)
        table.check_known(self.name, declared, self.initial, self.rows, self.final)
        return declared

    def _compile(self) -> dict[str, dict[str, str]]:
        expanded = table.expand(self.rows, self.states, self.final)
        table.check_graph(self.name, self.states, self.initial, expanded, self.final)
        from transitions import Machine  # loaded with the first table, not with the program

        machine = Machine(model=None, auto_transitions=False, **self.machine_spec(expanded))
        lookup: dict[str, dict[str, str]] = {state: {} for state in self.states}
        for outcome, event in machine.events.items():
            for source, rows in event.transitions.items():
                lookup[source][outcome] = str(rows[0].dest)
        return lookup

    def machine_spec(self, expanded: Sequence[Row] | None = None) -> dict[str, Any]:
        """Keyword arguments that declare this table to a `transitions` machine."""
        rows = (
            expanded if expanded is not None else table.expand(self.rows, self.states, self.final)
        )
        return {
            "states": [{"name": s, "final": s in self.final} for s in self.states],
            "initial": self.initial,
            "transitions": [{"trigger": o, "source": s, "dest": d} for s, o, d in rows],
        }

    def next_state(self, state: str, outcome: str) -> str | None:
        """The state `outcome` leads to from `state`, or None if no row allows it."""
        return self._lookup.get(state, {}).get(outcome)

    def routes_implicitly(self, state: str, stage: str) -> bool:
        """Whether an outcome of `stage` recorded in `state` takes the hub's implicit route."""
        return table.implicit_route(self.hub, state, stage, self.next_state(state, stage))

    def allowed(self, state: str) -> tuple[str, ...]:
        """The outcomes the table allows in `state`, sorted."""
        return tuple(sorted(self._lookup.get(state, ())))

    def is_final(self, state: str) -> bool:
        """Whether `state` is one of the final states."""
        return state in self.final

    def to_dict(self) -> dict[str, Any]:
        """The definition as JSON data, as stored in `RunStarted.table`.

        ``hub`` only when one is declared: a table without one is stored as before hubs.
        """
        data: dict[str, Any] = {
            "name": self.name,
            "initial": self.initial,
            "final": list(self.final),
            "states": list(self.states),
            "transitions": [list(row) for row in self.rows],
        }
        if self.hub is not None:
            data["hub"] = self.hub
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pipeline:
        """Rebuild a pipeline from `to_dict()` data (cached: tables repeat across runs).

        Raises:
            PipelineError: if the data is not a valid definition.
        """
        if not isinstance(data, Mapping):
            raise PipelineError("?", f"a stored table must be an object, got {type(data).__name__}")
        try:
            text = json.dumps(data, sort_keys=True)
        except (TypeError, ValueError, RecursionError) as error:
            problem = "nested too deeply" if isinstance(error, RecursionError) else str(error)
            name = str(data.get("name", "?"))
            raise PipelineError(name, f"stored table is not JSON: {problem}") from None
        return _from_json(text)

    def to_mermaid(self, current: str | None = None) -> str:
        """Mermaid `stateDiagram-v2` source of the table, drawn by `transitions`."""
        return diagram.mermaid(self.name, self.machine_spec(), current)

    def to_dot(self, current: str | None = None) -> str:
        """Graphviz DOT source of the table, drawn by `transitions`."""
        return diagram.dot(self.name, self.machine_spec(), current)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Pipeline):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.name, self.rows, self.hub))

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, {len(self.states)} states, {len(self.rows)} rows)"


@lru_cache(maxsize=256)
def _from_json(text: str) -> Pipeline:
    data = json.loads(text)
    name = data.get("name", "?")
    try:
        return Pipeline(
            data["name"],
            initial=data["initial"],
            transitions=data["transitions"],
            final=data["final"],
            states=data.get("states"),
            hub=data.get("hub"),
        )
    except (KeyError, TypeError) as error:
        raise PipelineError(str(name), f"stored table is malformed: {error!r}") from error
